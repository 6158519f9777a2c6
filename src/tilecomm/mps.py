"""Rank processes that share a GPU run at the same time: an MPS control daemon for them.

Without MPS, processes sharing one GPU get it in time slices: a kernel that waits for a peer's
signal spins until the peer's context is scheduled, so every collective costs a time slice
(2.3 ms per call on an H200, whatever its size). With the CUDA Multi-Process Service their
kernels run concurrently.

    with MpsDaemon(ranks_per_device=4) as mps:      # started here, or one already running
        env = mps.rank_env()                         # give it to every rank before CUDA starts
        ...                                          # start the ranks
    # "quit" sent to a daemon this object started, on every way out

What it does and never does:

* it starts ``nvidia-cuda-mps-control -d`` only if no daemon answers already (the pipe
  directory of ``CUDA_MPS_PIPE_DIRECTORY``, else ``/tmp/nvidia-mps``) and no GPU is in the
  compute mode ``Prohibited``; its pipe and log directories are in a private temporary
  directory, which every rank gets in ``CUDA_MPS_PIPE_DIRECTORY`` / ``CUDA_MPS_LOG_DIRECTORY``;
* each rank gets ``CUDA_MPS_ACTIVE_THREAD_PERCENTAGE`` = ``100 // ranks_per_device``, so the
  shares of the ranks on one GPU sum to at most 100 (the driver then reports that share of
  the SMs as the rank's multiprocessor count: see :mod:`tilecomm.device.budget`);
* it sends ``quit`` to a daemon it started when the block ends, on an exception, at interpreter
  exit and on SIGTERM/SIGINT/SIGHUP (then the signal's previous handling goes on); a daemon it
  found running is left alone;
* it changes no setting of the GPU (compute mode, clocks, persistence, MIG are only read, by
  the caller's preflight); where the daemon cannot start, :attr:`MpsDaemon.state` says why and
  the ranks run without it (time slices: correct, but not a speed measurement).

``TILECOMM_MPS_CONTROL`` names the control program (tests point it at a fake).
"""

from __future__ import annotations

import atexit
import os
import shutil
import signal
import subprocess
import tempfile
import threading
import time
from dataclasses import dataclass, field

#: where a daemon started without CUDA_MPS_PIPE_DIRECTORY listens (the driver's default)
DEFAULT_PIPE_DIR = "/tmp/nvidia-mps"
#: seconds a start or a quit may take before it is given up
START_TIMEOUT = 10.0
QUIT_TIMEOUT = 10.0


def control_program() -> str:
    """The MPS control program: ``TILECOMM_MPS_CONTROL`` or ``nvidia-cuda-mps-control``."""
    from .settings import settings

    return settings().mps_control


def thread_percentage(ranks_per_device: int) -> int:
    """Each rank's ``CUDA_MPS_ACTIVE_THREAD_PERCENTAGE`` when ``ranks_per_device`` ranks share
    one GPU: the largest whole share whose sum over the ranks is at most 100."""
    n = max(1, int(ranks_per_device))
    return max(1, 100 // n)


@dataclass
class MpsState:
    """What :meth:`MpsDaemon.start` found or did."""

    #: "started" (this object started a daemon), "running" (one was already answering),
    #: "unavailable" (none, and none could start), "off" (not asked for)
    status: str
    reason: str = ""
    pipe_dir: str | None = None
    log_dir: str | None = None
    #: CUDA_MPS_ACTIVE_THREAD_PERCENTAGE each rank gets (None: no share set)
    percentage: int | None = None
    #: what the control program printed when it failed, and the daemon's log tail
    detail: list[str] = field(default_factory=list)

    @property
    def active(self) -> bool:
        return self.status in ("started", "running")

    def as_dict(self) -> dict:
        return dict(status=self.status, reason=self.reason, pipe_dir=self.pipe_dir,
                    log_dir=self.log_dir, percentage=self.percentage, detail=self.detail)


class MpsDaemon:
    """An MPS control daemon for ``ranks_per_device`` rank processes per GPU (see the module
    docstring). ``compute_modes``: the GPUs' compute modes as nvidia-smi names them, when the
    caller read them (a ``Prohibited`` GPU cannot run MPS clients); ``log``: progress lines."""

    def __init__(self, ranks_per_device: int, *, compute_modes: list[str] | None = None,
                 control: str | None = None, log=None):
        self.ranks_per_device = int(ranks_per_device)
        self.compute_modes = list(compute_modes or [])
        self.control = control or control_program()
        self.log = log or (lambda s: None)
        self.state = MpsState("off")
        self._tmp: str | None = None
        self._started = False
        self._lock = threading.Lock()
        self._old_handlers: dict = {}

    # ---- start ---------------------------------------------------------------------------
    def start(self) -> MpsState:
        """Use a running daemon or start one; never raises for a daemon that cannot start
        (the state says why)."""
        pct = thread_percentage(self.ranks_per_device)
        if any(m.strip().lower() == "prohibited" for m in self.compute_modes):
            self.state = MpsState("unavailable", "a GPU is in compute mode Prohibited "
                                  "(left as it is)")
            return self.state
        if shutil.which(self.control) is None:
            self.state = MpsState("unavailable", f"{self.control} not found on PATH")
            return self.state
        existing = os.environ.get("CUDA_MPS_PIPE_DIRECTORY") or DEFAULT_PIPE_DIR
        if self._answers(existing):
            self.state = MpsState("running", f"a daemon already answers on {existing}",
                                  pipe_dir=existing,
                                  log_dir=os.environ.get("CUDA_MPS_LOG_DIRECTORY"),
                                  percentage=pct)
            return self.state
        self._tmp = tempfile.mkdtemp(prefix="tilecomm-mps-")
        pipe, logd = os.path.join(self._tmp, "pipe"), os.path.join(self._tmp, "log")
        os.makedirs(pipe)
        os.makedirs(logd)
        self._install_exits()
        # its output to a file, not a pipe: a daemon that kept the pipe open would hold us
        out_path = os.path.join(self._tmp, "start.out")
        try:
            with open(out_path, "w") as out:
                r = subprocess.run([self.control, "-d"], env=self._env(pipe, logd),
                                   stdin=subprocess.DEVNULL, stdout=out, stderr=out,
                                   timeout=START_TIMEOUT)
        except (OSError, subprocess.TimeoutExpired) as e:
            return self._unavailable(f"{self.control} -d: {type(e).__name__}: {e}", pipe, logd)
        if r.returncode != 0:
            with open(out_path, errors="replace") as f:
                said = f.read().strip().splitlines()[-5:]
            return self._unavailable(f"{self.control} -d exited with {r.returncode}", pipe,
                                     logd, said)
        self._started = True            # from here on, quit on every way out
        deadline = time.monotonic() + START_TIMEOUT
        while not self._answers(pipe):
            if time.monotonic() > deadline:
                self.stop()
                return self._unavailable(f"the daemon did not answer on {pipe} within "
                                         f"{START_TIMEOUT:.0f} s", pipe, logd)
            time.sleep(0.05)
        self.state = MpsState("started", f"started with pipes in {pipe}", pipe_dir=pipe,
                              log_dir=logd, percentage=pct)
        self.log(f"[mps] {self.state.reason}; {pct}% of the GPU's threads per rank")
        return self.state

    def _unavailable(self, reason, pipe, logd, detail=None) -> MpsState:
        self.state = MpsState("unavailable", reason, pipe_dir=pipe, log_dir=logd,
                              detail=list(detail or []) + _log_tail(logd))
        self._cleanup_tmp()
        return self.state

    def _env(self, pipe: str, logd: str | None) -> dict:
        env = dict(os.environ, CUDA_MPS_PIPE_DIRECTORY=pipe)
        if logd:
            env["CUDA_MPS_LOG_DIRECTORY"] = logd
        return env

    def _answers(self, pipe: str) -> bool:
        """True when a control daemon answers on ``pipe`` (a query that changes nothing)."""
        if not os.path.exists(os.path.join(pipe, "control")):
            return False
        try:
            r = subprocess.run([self.control], input="get_server_list\n", text=True,
                               capture_output=True, timeout=5,
                               env=self._env(pipe, os.environ.get("CUDA_MPS_LOG_DIRECTORY")))
        except (OSError, subprocess.TimeoutExpired):
            return False
        return r.returncode == 0

    # ---- what the ranks get --------------------------------------------------------------
    def rank_env(self) -> dict[str, str]:
        """Environment every rank needs before it initializes CUDA (empty without MPS)."""
        s = self.state
        if not s.active:
            return {}
        env = {"CUDA_MPS_PIPE_DIRECTORY": s.pipe_dir}
        if s.log_dir:
            env["CUDA_MPS_LOG_DIRECTORY"] = s.log_dir
        if s.percentage is not None and s.percentage < 100:
            env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] = str(s.percentage)
        return env

    # ---- stop ----------------------------------------------------------------------------
    def stop(self) -> bool:
        """Send ``quit`` to the daemon this object started (none found running is touched) and
        wait until it no longer answers; True when it is gone (or there was none). Safe to
        call more than once and from a signal handler."""
        with self._lock:
            if not self._started:
                self._restore_handlers()
                return True
            self._started = False
        pipe, logd = self.state.pipe_dir, self.state.log_dir
        gone = False
        try:
            subprocess.run([self.control], input="quit\n", text=True, capture_output=True,
                           timeout=QUIT_TIMEOUT, env=self._env(pipe, logd))
            deadline = time.monotonic() + QUIT_TIMEOUT
            while self._answers(pipe) and time.monotonic() < deadline:
                time.sleep(0.05)
            gone = not self._answers(pipe)
        except (OSError, subprocess.TimeoutExpired) as e:
            self.state.detail.append(f"quit: {type(e).__name__}: {e}")
        self.state.detail += _log_tail(logd)
        if not gone:
            self.state.detail.append(f"the daemon still answered on {pipe} after quit")
        self.log(f"[mps] quit sent to the daemon on {pipe}: "
                 f"{'stopped' if gone else 'STILL ANSWERING'}")
        self._restore_handlers()
        self._cleanup_tmp()
        return gone

    def _cleanup_tmp(self) -> None:
        if self._tmp:
            shutil.rmtree(self._tmp, ignore_errors=True)
            self._tmp = None

    # ---- every way out ----------------------------------------------------------------------
    def _install_exits(self) -> None:
        atexit.register(self.stop)
        if threading.current_thread() is not threading.main_thread():
            return
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            try:
                self._old_handlers[sig] = signal.signal(sig, self._on_signal)
            except (OSError, ValueError):
                pass

    def _on_signal(self, signum, frame) -> None:
        self.stop()                         # restores the previous handlers
        old = self._old_handlers.get(signum, signal.SIG_DFL)
        if callable(old):
            old(signum, frame)
        elif old == signal.SIG_DFL:
            signal.signal(signum, signal.SIG_DFL)
            os.kill(os.getpid(), signum)

    def _restore_handlers(self) -> None:
        if threading.current_thread() is threading.main_thread():
            for sig, old in self._old_handlers.items():
                try:
                    signal.signal(sig, old)
                except (OSError, ValueError, TypeError):
                    pass
        self._old_handlers = {}
        try:
            atexit.unregister(self.stop)
        except Exception:  # noqa: BLE001
            pass

    def __enter__(self) -> "MpsDaemon":
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


def _log_tail(logd: str | None, lines: int = 5) -> list[str]:
    """The last lines of the daemon's control log (where it says why it failed)."""
    if not logd:
        return []
    path = os.path.join(logd, "control.log")
    try:
        with open(path, errors="replace") as f:
            return [f"control.log: {x.rstrip()}" for x in f.readlines()[-lines:]]
    except OSError:
        return []


def ranks_per_device(world_size: int, device_count: int, device: str = "cuda") -> int:
    """How many of ``world_size`` ranks share the busiest GPU when rank ``r`` takes
    ``cuda:{r % device_count}`` (``device="cuda"``) or every rank takes one GPU
    (``device="cuda:N"``)."""
    if device.startswith("cuda:"):
        return world_size
    n = max(1, int(device_count))
    return -(-world_size // n)

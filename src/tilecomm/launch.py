"""Starting ranks: ``launch(fn, world_size)`` for local processes, ``init()`` under torchrun.

The launcher creates every rank's segment file before starting the ranks and unlinks them all
when it returns, whatever happened; each rank also unlinks its own file as soon as every rank
has mapped it (see ``heap/shm.py``), so a crash of the launcher itself leaves nothing behind.
"""

from __future__ import annotations

import multiprocessing as mp
import multiprocessing.connection as mpc
import os
import pickle
import signal
import sys
import threading
import time
import traceback
from typing import Any, Callable

from . import orphan, procfs
from .backends.cpu import CpuBackend
from .communicator import Communicator
from .debug import flight as _flight, trace as _trace
from .errors import CommError, RankError
from .heap.base import SegmentLayout
from .heap.shm import ShmHeap, create_segment_file, unlink_quietly
from .settings import settings


def _layout(world_size: int, heap_bytes: int | None, scratch_bytes: int | None) -> SegmentLayout:
    s = settings()
    return SegmentLayout(world_size, scratch_bytes or s.scratch_bytes, heap_bytes or s.heap_bytes)


def _make_comm(rank: int, layout: SegmentLayout, paths: list[str], timeout: float,
               deterministic: bool | None = None) -> Communicator:
    heap = ShmHeap(rank, layout, paths)
    backend = CpuBackend(heap, timeout=timeout, spin=settings().spin,
                         scratch_bytes=layout.scratch_bytes)
    comm = Communicator(backend, heap, timeout=timeout, deterministic=deterministic)
    # every rank has mapped every file; the ranks compare their cost models (auto)
    comm.settle_costs(comm.host.rendezvous("init", layout.total_bytes, comm.costs_word()))
    heap.unlink()
    return comm


class _Leave(BaseException):
    """Raised in a rank by SIGTERM when its group asked for clean leaves (see RankGroup)."""


def _leave_on_sigterm() -> None:
    def handler(signum, frame):
        raise _Leave()
    signal.signal(signal.SIGTERM, handler)


def _finish_device_work() -> None:
    """Before a rank process exits: wait for the kernels it queued (their waits are bounded),
    so its CUDA context is torn down idle. A client killed with kernels in flight can leave
    an MPS server unusable for the other ranks."""
    torch = sys.modules.get("torch")
    try:
        if torch is not None and torch.cuda.is_initialized():
            torch.cuda.synchronize()
    except Exception:  # noqa: BLE001 - a sticky CUDA error: nothing left to wait for
        pass


def _rank_main(rank: int, layout: SegmentLayout, paths: list[str], timeout: float, conn,
               first_task, deterministic: bool | None = None, parent_pid: int | None = None,
               main_thread: bool = False, env: dict | None = None,
               clean_leave: bool = False) -> None:
    """Body of a rank process: build the communicator, then run tasks from the launcher.

    The rank ends with its launcher (see ``orphan.py``): ``parent_pid`` is the launcher's pid
    when it is the parent, ``main_thread`` whether the launcher's main thread started it.
    ``env``: variables set before anything else (before CUDA starts: MPS). ``clean_leave``:
    SIGTERM unwinds the rank (its kernels finished first) instead of killing it."""
    code = 0
    try:
        os.environ.update(env or {})
        if clean_leave:
            _leave_on_sigterm()
        orphan.watch_parent(parent_pid, orphan.unlink_all(paths))
        import torch
        torch.set_num_threads(1)  # one core per rank: ranks, not threads, share the machine
        _bind(rank, layout.world_size)
        comm = _make_comm(rank, layout, paths, timeout, deterministic)
        if main_thread:         # the files are gone: a kill by the kernel leaves nothing
            orphan.die_with_parent_thread()
        task = first_task
        while True:
            if task is None:
                task = conn.recv()
                if task is None:
                    break
            fn, args = task
            task = None
            try:
                result = fn(comm, *args)
                # NOTE [results by value]: plain pickle, not the Connection's ForkingPickler:
                # that one shares a tensor's storage through shared memory, which the parent
                # maps only when it unpickles, i.e. after this process may have exited (a
                # returned tensor then failed with "exited with code 0 before returning").
                _send(conn, ("ok", result))
            except _Leave:
                raise
            except BaseException as e:  # noqa: BLE001 - reported to the launcher
                _send(conn, ("err", type(e).__name__, str(e), traceback.format_exc(),
                             tuple(getattr(e, "missing", ()))))
            if first_task is not None:
                break
    except _Leave:
        code = 128 + signal.SIGTERM
    except BaseException as e:  # noqa: BLE001
        try:
            _send(conn, ("err", type(e).__name__, str(e), traceback.format_exc()))
        except Exception:
            pass
        code = 1
    finally:
        if clean_leave:
            _finish_device_work()
        _trace.flush()       # TILECOMM_TRACE: os._exit skips the atexit hook that writes it
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)  # never run the parent's atexit handlers in a forked child


def _send(conn, msg: tuple) -> None:
    """Send a rank's report by value (see NOTE [results by value]); a result that cannot be
    pickled becomes an error report naming it."""
    try:
        data = pickle.dumps(msg, protocol=pickle.HIGHEST_PROTOCOL)
    except Exception as e:  # noqa: BLE001 - reported to the launcher instead
        if msg[0] != "ok":
            raise
        data = pickle.dumps(("err", type(e).__name__,
                             f"the result of the rank's function cannot be pickled: {e}",
                             traceback.format_exc()))
    conn.send_bytes(data)


def _recv(conn):
    """A report sent by :func:`_send`."""
    return pickle.loads(conn.recv_bytes())


def _bind(rank: int, world_size: int) -> None:
    """Pin rank r to core r when every rank can have its own core (as MPI launchers do):
    caches stay warm and the ranks never share a core. Skipped when oversubscribed or when
    TILECOMM_BIND=0."""
    if not settings().bind or not hasattr(os, "sched_setaffinity"):
        return
    cores = sorted(os.sched_getaffinity(0))
    if world_size <= len(cores):
        os.sched_setaffinity(0, {cores[rank]})


class RankGroup:
    """``world_size`` local rank processes, each holding a ready :class:`Communicator`.

    :func:`launch` runs one function on a fresh group; tests keep a group alive and run many
    functions on it (``run``), which is much faster than starting processes per test.
    """

    def __init__(self, world_size: int, *, timeout: float | None = None,
                 heap_bytes: int | None = None, scratch_bytes: int | None = None,
                 start_method: str | None = None, deterministic: bool | None = None,
                 env: dict[str, str] | None = None, leave_grace: float = 0.0):
        """``env``: environment variables every rank sets before anything else (e.g.
        :meth:`tilecomm.mps.MpsDaemon.rank_env`). ``leave_grace``: seconds :meth:`stop`
        gives ranks that did not exit when asked to unwind after SIGTERM (finishing their
        queued GPU kernels) before it kills them; 0 (default) kills them at once."""
        if not isinstance(world_size, int) or world_size < 1:
            raise ValueError(f"world_size must be a positive int, got {world_size!r}")
        self.world_size = world_size
        self.env = dict(env or {})
        self.leave_grace = float(leave_grace)
        self.timeout = settings().timeout if timeout is None else float(timeout)
        self.layout = _layout(world_size, heap_bytes, scratch_bytes)
        self.deterministic = deterministic
        self.ctx = mp.get_context(start_method or settings().start_method)
        self.procs: list[mp.process.BaseProcess] = []
        self.conns: list[Any] = []
        self.paths: list[str] = []
        self._busy = False     # tasks sent whose results were not all collected

    def start(self, first_task=None) -> "RankGroup":
        """Create the segment files and start the ranks (running ``first_task`` if given)."""
        self._busy = first_task is not None
        try:
            shm_dir = settings().shm_dir
            # a forkserver's ranks are children of the fork server, which exits with us
            launcher = None if self.ctx.get_start_method() == "forkserver" else os.getpid()
            main = threading.current_thread() is threading.main_thread()
            for _ in range(self.world_size):   # one at a time: stop() must see every file made
                self.paths.append(create_segment_file(shm_dir, self.layout.total_bytes))
            for r in range(self.world_size):
                parent, child = self.ctx.Pipe()
                p = self.ctx.Process(target=_rank_main, name=f"tilecomm-rank-{r}", daemon=True,
                                     args=(r, self.layout, self.paths, self.timeout, child,
                                           first_task, self.deterministic, launcher, main,
                                           self.env, self.leave_grace > 0))
                p.start()
                child.close()
                self.procs.append(p)
                self.conns.append(parent)
        except BaseException:
            self.stop()
            raise
        return self

    def run(self, fn: Callable, *args) -> list:
        """Run ``fn(comm, *args)`` on every rank; results in rank order (see :func:`launch`)."""
        self._busy = True
        for c in self.conns:
            c.send((fn, args))
        return self.collect()

    def collect(self, grace: float = 2.0, keep_going: bool = False) -> list:
        """Wait for one result per rank.

        On the first failure (an exception, or a process that died) the other ranks get
        ``grace`` seconds to report (a peer's death makes them raise CommTimeout quickly), then
        all are stopped and :class:`RankError` is raised for the first failing rank, with the
        others' errors in ``RankError.others``. ``keep_going``: a failure stops nobody; every
        rank runs to its end, and a failed rank's place in the results holds its
        :class:`RankError` (raised for none).
        """
        results: dict[int, Any] = {}
        failures: dict[int, tuple[str, str, str]] = {}
        pending = set(range(self.world_size))
        deadline = None
        while pending:
            remaining = None if deadline is None else max(0.0, deadline - time.monotonic())
            if keep_going and (results or failures):
                remaining = 0.5
            objs = [self.conns[r] for r in pending] + [self.procs[r].sentinel for r in pending]
            ready = mpc.wait(objs, timeout=remaining)
            if not ready and deadline is not None:
                break
            stopped = procfs.STOPPED
            if not ready and keep_going and all(procfs.state(self.procs[r].pid) in stopped
                                                for r in pending):
                # a rank stopped (SIGSTOP) never reports: once it is all that is left, it is
                # a failed rank (killed; its peers have gone on without it)
                for r in pending:
                    self.procs[r].kill()
                    self.procs[r].join(timeout=5)
                    failures[r] = ("exit", "rank process was stopped (SIGSTOP) while the "
                                   "others finished; killed", "")
                break
            for r in sorted(pending):
                conn, proc = self.conns[r], self.procs[r]
                msg = None
                if conn in ready or (proc.sentinel in ready and conn.poll()):
                    try:
                        msg = _recv(conn)
                    except (EOFError, OSError):
                        msg = None
                    except Exception as e:  # noqa: BLE001 - e.g. a class the parent lacks
                        msg = ("err", type(e).__name__,
                               f"the result of rank {r} cannot be unpickled here: {e}", "")
                elif proc.sentinel not in ready:
                    continue
                pending.discard(r)
                if msg is None:
                    failures[r] = ("exit", self._exit_reason(r), "")
                elif msg[0] == "ok":
                    results[r] = msg[1]
                else:
                    failures[r] = msg[1:]
                if r in failures and deadline is None and not keep_going:
                    deadline = time.monotonic() + grace
        if keep_going:
            self._busy = False
            return [results[r] if r in results else _rank_error(r, failures[r])
                    for r in range(self.world_size)]
        if failures:
            # the ranks that reported exit at once when asked; the others are stuck
            self.stop(grace=0.5)
            first = min(failures, key=lambda r: (failures[r][0] in ("CommTimeout", "CommError"), r))
            err = _rank_error(first, failures[first])
            err.others = {r: f[:3] for r, f in failures.items() if r != first}
            raise err
        self._busy = False
        return [results[r] for r in range(self.world_size)]

    def _exit_reason(self, rank: int) -> str:
        p = self.procs[rank]
        p.join(timeout=1)
        code = p.exitcode
        if code is not None and code < 0:
            return f"rank process was killed by {signal.Signals(-code).name}"
        text = f"rank process exited with code {code} before returning"
        if self.ctx.get_start_method() != "fork":
            # it never reported: under spawn/forkserver it may have failed while importing the
            # main module again, before tilecomm ran in it
            text += (f" (under the {self.ctx.get_start_method()} start method every rank "
                     f"imports the main module again: a program that calls tilecomm.launch "
                     f"outside an `if __name__ == \"__main__\":` block fails there; the rank's "
                     f"traceback is on stderr)")
        return text

    def stop(self, grace: float = 2.0) -> None:
        """Stop every rank and remove the segment files: all ranks are asked to exit at once,
        get ``grace`` seconds together (one deadline, not one per rank: busy ranks never read
        the request, and 3 of them used to cost 3 x 2 s), then the rest are killed at once.
        Ranks stopped in the middle of a task first write their flight records
        (TILECOMM_DEBUG_DIR)."""
        if self._busy and settings().debug_dir:
            _flight.request_dumps({r: p.pid for r, p in enumerate(self.procs) if p.is_alive()},
                                  settings().debug_dir)
        self._busy = False
        for c in self.conns:
            try:
                c.send(None)
            except (OSError, ValueError):
                pass
        _join_all(self.procs, grace)
        if self.leave_grace > 0:          # unwind first: a killed GPU client can wedge MPS
            for p in self.procs:
                if p.is_alive():
                    p.terminate()
            _join_all(self.procs, self.leave_grace)
        for p in self.procs:
            if p.is_alive():
                p.kill()
        _join_all(self.procs, 5.0)
        for c in self.conns:
            c.close()
        for path in self.paths:
            unlink_quietly(path)
        self.procs, self.conns, self.paths = [], [], []

    def __enter__(self) -> "RankGroup":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


def _rank_error(rank: int, failure: tuple) -> RankError:
    """The RankError of ``rank``'s failure report ``(type, message, traceback[, missing])``."""
    exc_type, message, tb = failure[:3]
    # the ranks at fault: those the reporter's timeout waited for, or the reporter itself
    # when its process died
    culprits = (rank,) if exc_type == "exit" else (failure[3] if len(failure) > 3 else ())
    return RankError(rank, exc_type, message, tb, culprits=culprits)


def _join_all(procs, seconds: float) -> None:
    """Wait until every process in ``procs`` has ended or ``seconds`` have passed (in all)."""
    deadline = time.monotonic() + seconds
    alive = [p for p in procs if p.exitcode is None]
    while alive:
        left = deadline - time.monotonic()
        if left <= 0:
            return
        mpc.wait([p.sentinel for p in alive], timeout=left)
        alive = [p for p in alive if p.exitcode is None]
    for p in procs:
        p.join(timeout=0)        # reap


def launch(fn: Callable, world_size: int, *args, timeout: float | None = None,
           heap_bytes: int | None = None, scratch_bytes: int | None = None,
           start_method: str | None = None, deterministic: bool | None = None,
           mps: bool = False, keep_going: bool = False) -> list:
    """Run ``fn(comm, *args)`` in ``world_size`` new local processes; return results by rank.

    ``timeout`` bounds every wait inside a collective (default ``TILECOMM_TIMEOUT``). If a rank
    raises or dies, the others are stopped and :class:`~tilecomm.RankError` is raised with that
    rank's number and traceback. With the default ``fork`` start method ``fn`` may be any
    callable; with ``spawn`` it must be importable. ``deterministic``: the communicators'
    deterministic mode (default ``TILECOMM_DETERMINISTIC``; see ``Communicator.deterministic``).
    ``mps``: the ranks use CUDA and share GPUs (rank r on ``cuda:{r % device_count}``): run
    them under an MPS control daemon (:mod:`tilecomm.mps`: started if none runs, each rank
    given its share of the GPU, quit afterwards; without one the ranks run in time slices)
    and let them finish their kernels before they are stopped.
    ``keep_going``: when a rank raises or dies the others go on (they see the failure as
    their Communicator reports it: a CommTimeout naming the rank, within about 0.2 s of a
    death, and may ``shrink`` past it); the results hold a :class:`~tilecomm.RankError` in
    the place of each rank that failed, and nothing is raised.
    """
    daemon, env, grace = None, {}, 0.0
    if mps:
        import torch

        from .mps import MpsDaemon, ranks_per_device
        daemon = MpsDaemon(ranks_per_device(world_size, torch.cuda.device_count()))
        daemon.start()
        env, grace = daemon.rank_env(), settings().device_timeout + 5
    try:
        group = RankGroup(world_size, timeout=timeout, heap_bytes=heap_bytes,
                          scratch_bytes=scratch_bytes, start_method=start_method,
                          deterministic=deterministic, env=env, leave_grace=grace)
        group.start(first_task=(fn, args))
        try:
            return group.collect(keep_going=keep_going)
        finally:
            group.stop()
    finally:
        if daemon is not None:
            daemon.stop()


#: how many times this process called :func:`init` (its store prefix follows the count)
_INITS = 0


def init(*, timeout: float | None = None, heap_bytes: int | None = None,
         scratch_bytes: int | None = None, deterministic: bool | None = None) -> Communicator:
    """The communicator of this process under torchrun (``RANK``, ``WORLD_SIZE``,
    ``MASTER_ADDR``, ``MASTER_PORT``), rendezvousing through torch.distributed's store.

    Ranks may span hosts (``torchrun --nnodes N``): see :func:`connect`.
    """
    import torch.distributed as dist

    missing = [v for v in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")
               if v not in os.environ]
    if missing:
        raise RuntimeError(f"tilecomm.init: {', '.join(missing)} not set; start the program "
                           f"with torchrun, or use tilecomm.launch for local ranks")
    tmo = settings().timeout if timeout is None else float(timeout)
    from datetime import timedelta
    store, rank, world = next(dist.rendezvous("env://", timeout=timedelta(seconds=tmo)))
    # Each init of this process meets under its own prefix: every rank makes the same calls in
    # the same order, so the k-th init of each rank meets the k-th of the others, and a second
    # init (after close) does not find the first one's keys.
    global _INITS
    _INITS += 1
    prefix = "tilecomm" if _INITS == 1 else f"tilecomm/init{_INITS}"
    return connect(dist.PrefixStore(prefix, store), rank, world, timeout=tmo,
                   heap_bytes=heap_bytes, scratch_bytes=scratch_bytes,
                   deterministic=deterministic)


def connect(store, rank: int, world_size: int, *, timeout: float | None = None,
            heap_bytes: int | None = None, scratch_bytes: int | None = None,
            deterministic: bool | None = None) -> Communicator:
    """A communicator for ``rank`` of ``world_size`` processes that meet through ``store``
    (any ``torch.distributed.Store``; give each group its own prefix).

    Ranks that can map each other's shared memory form a host (``hier/discover.py``). On one
    host the communicator is the shared-memory one; across hosts each host gets its own, and
    the hosts are joined by torch.distributed groups on the rails (``hier/``).
    """
    from .hier.discover import discover_hosts

    from .elastic import wait_keys

    tmo = settings().timeout if timeout is None else float(timeout)
    if settings().debug_dir:
        _flight.dump_on_sigterm()   # torchrun stops the ranks with SIGTERM when one fails
    # every wait of the start is bounded too, and names the ranks that never came
    store.set(f"arrived/{rank}", "1")
    wait_keys(store, [f"arrived/{r}" for r in range(world_size)], list(range(world_size)),
              tmo, f"init of rank {rank}", f"at init (world size {world_size})")
    layout = discover_hosts(dist_prefix(store, "hosts"), rank, world_size, settings().shm_dir)
    if layout.num_hosts == 1:
        comm = _connect_host(store, rank, world_size, tmo, heap_bytes, scratch_bytes,
                             deterministic)
        comm.membership.store = store
        return comm
    from .hier.backend import HierBackend
    from .hier.rails import Rails

    h = layout.host_of(rank)
    host = layout.hosts[h]
    local = _connect_host(dist_prefix(store, f"host{host[0]}"), layout.local_rank(rank),
                          len(host), tmo, heap_bytes, scratch_bytes, deterministic)
    try:
        addr = _gloo_host()
        rails = Rails(store, layout, rank, tmo, "cpu", host=addr)
        factory = lambda device: Rails(store, layout, rank, tmo, device, host=addr)  # noqa: E731
        be = HierBackend(local, layout, rank, rails, factory)
    except BaseException:
        local.close()
        raise
    comm = Communicator(be, local.host.heap, timeout=tmo, deterministic=deterministic,
                        heap_rank=local.rank, backends={"cpu": be, "cuda": be},
                        layout=layout)
    # the host's communicator is a step of the calls: its waits are recorded on them
    local.host.attach_debug(_flight.adopt_host_leg(local.flight, comm.flight, host),
                                getattr(local.host.channel, "trace", None))
    comm.settle_costs(be.rendezvous("init", 0, comm.costs_word()))
    comm.membership.store = store
    return comm


def _gloo_host() -> str | None:
    """TILECOMM_GLOO_HOST, else loopback when the rendezvous is on loopback."""
    if settings().gloo_host:
        return settings().gloo_host
    master = os.environ.get("MASTER_ADDR", "127.0.0.1")
    if master in ("localhost", "::1") or master.startswith("127."):
        return "127.0.0.1"
    return None


def rendezvous_host() -> str:
    """Where a rank serves a rendezvous store to others (``comm.grow``): TILECOMM_GLOO_HOST,
    else loopback when the job's rendezvous is on loopback (or there is none: one host), else
    this host's name."""
    import socket

    return _gloo_host() or socket.gethostname()


def dist_prefix(store, prefix: str):
    import torch.distributed as dist

    return dist.PrefixStore(prefix, store)


def _connect_host(store, rank: int, world_size: int, tmo: float, heap_bytes, scratch_bytes,
                  deterministic) -> Communicator:
    """The shared-memory communicator of ``world_size`` ranks of one host."""
    layout = _layout(world_size, heap_bytes, scratch_bytes)
    path = create_segment_file(settings().shm_dir, layout.total_bytes)
    # torchrun stops the other ranks with SIGTERM when one fails: make that unwind through the
    # finally below (which removes the file) instead of killing the process on the spot.
    previous = _raise_on_sigterm()
    try:
        store.set(f"seg/{rank}", f"{layout.total_bytes}|{path}")
        infos = [store.get(f"seg/{r}").decode().split("|", 1) for r in range(world_size)]
        sizes = {int(s) for s, _ in infos}
        if len(sizes) > 1:
            raise CommError(f"tilecomm: ranks use different heap sizes {sorted(sizes)}; set "
                            f"TILECOMM_HEAP_BYTES / TILECOMM_SCRATCH_BYTES alike on every rank")
        return _make_comm(rank, layout, [p for _, p in infos], tmo, deterministic)
    finally:
        unlink_quietly(path)
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)


def _raise_on_sigterm():
    """Turn SIGTERM into SystemExit while a segment file exists (main thread only)."""
    import threading

    if threading.current_thread() is not threading.main_thread():
        return None

    def handler(signum, frame):
        raise SystemExit(128 + signum)

    return signal.signal(signal.SIGTERM, handler)

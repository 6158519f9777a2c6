"""The flight recorder: every rank keeps its last N calls, and writes them out when asked.

One :class:`FlightRecorder` per communicator (``comm.flight``) holds a ring (``deque`` with
``maxlen=TILECOMM_FLIGHT_RECORDS``) of :class:`Record` objects, one per call:

    seq        the communicator's call number; ``#0`` is the handshake made when the
               communicator was created, so the first call is ``#1`` (the ``#N`` of the host
               executor's error messages). Collectives, barrier and alloc count, and so does a
               call this rank rejected (its peers see the rejection at the same number);
               send/recv/synchronize have ``seq`` None (they are not matched across the group).
    op, algorithm, bytes (this rank's input), dtype, root, peer (send/recv)
    state      "issued" -> "waiting" (only while a bounded wait has had to block, with
               ``wait = {"ranks", "phase", "since_ns"}``) -> "completed" or "failed" (``error``)
    issued_ns / ended_ns   host wall-clock timestamps (``time.time_ns``)
    device     a GPU backend's device-side wait record when one was read (the decoded error
               word: rank, peer, epoch, slot, observed, site) and ``device_call``

NOTE [recording cost]
    The recorder is on by default, so a call pays for it: one small object, two clock reads and
    a deque append (about 1 us; ``benchmarks/flight_overhead.py``). Nothing is recorded on a
    wait's fast path: the channel tells the recorder only once a wait has had to block for a
    while (see ``Channel.wait_slots``), and the record is serialized only when dumped.

With ``TILECOMM_DEBUG_DIR=DIR`` every live rank writes ``DIR/flight-rank{R}.json`` (all the
communicators of the process, with host name, pid, rank and world size) when a call raises a
CommError, on SIGUSR1, on ``comm.dump_flight()``, and when ``tilecomm.launch`` stops it (the
launcher signals SIGUSR1 and waits briefly, :func:`request_dumps`). ``tilecomm trace analyze
DIR`` reads them (``analyze.py``).
"""

from __future__ import annotations

import json
import os
import signal
import socket
import threading
import time
import weakref
from collections import deque

from .. import procfs

FORMAT = "tilecomm-flight/1"
#: how the error of a call this rank refused (bad argument) begins
REJECTED = "rejected by this rank: "

#: the live recorders of this process, oldest first (cleared in a forked child)
_recorders: "weakref.WeakValueDictionary[int, FlightRecorder]" = weakref.WeakValueDictionary()
_next_id = [0]
_handler_installed = [False]
_term_installed = [False]
_lock = threading.Lock()
#: held while a dump is written: a SIGUSR1 arriving meanwhile (same thread) skips its own
_dump_lock = threading.Lock()


class Record:
    """One call as this rank saw it (fields: see the module docstring)."""

    __slots__ = ("seq", "op", "algorithm", "nbytes", "dtype", "root", "peer", "state",
                 "issued_ns", "ended_ns", "wait", "error", "device", "note")

    def __init__(self, seq, op, algorithm, nbytes, dtype, root, peer, issued_ns):
        self.seq, self.op, self.algorithm, self.nbytes = seq, op, algorithm, nbytes
        self.dtype, self.root, self.peer = dtype, root, peer
        self.state = "issued"
        self.issued_ns = issued_ns
        self.ended_ns = None
        self.wait = None
        self.error = None
        self.device = None
        self.note = None

    def to_json(self) -> dict:
        return {"seq": self.seq, "op": self.op, "algorithm": self.algorithm,
                "bytes": self.nbytes, "dtype": self.dtype, "root": self.root,
                "peers": None if self.peer is None else [self.peer], "state": self.state,
                "issued_ns": self.issued_ns, "ended_ns": self.ended_ns, "wait": self.wait,
                "error": self.error, "device": self.device, "note": self.note}


class FlightRecorder:
    """The last ``capacity`` calls of one communicator (rank ``rank`` of ``world_size``).

    ``capacity`` 0 records nothing (``enabled`` False). ``tracer``: a
    :class:`tilecomm.debug.trace.Tracer` that also gets a complete event per call, or None.
    """

    def __init__(self, rank: int, world_size: int, capacity: int, *, debug_dir: str = "",
                 tracer=None):
        self.rank, self.world_size = rank, world_size
        self.capacity = max(0, int(capacity))
        self.enabled = self.capacity > 0
        self.records: deque = deque(maxlen=max(1, self.capacity))
        self.next_seq = 1            # #0 is the communicator's creation handshake
        self.debug_dir = debug_dir
        self.tracer = tracer
        self.created_ns = time.time_ns()
        with _lock:
            self.id = _next_id[0]    # creation order: the same on every rank of a group
            _next_id[0] += 1
            _recorders[self.id] = self
        if debug_dir:
            _install_handler()

    # ---- recording (the Communicator's hooks) -----------------------------------------------
    def issue(self, op: str, algorithm, nbytes: int, dtype, root=None, peer=None,
              ordered: bool = True) -> Record:
        """A new record in state "issued"; ``ordered``: it takes the next sequence number."""
        if ordered:
            seq = self.next_seq
            self.next_seq = seq + 1
        else:
            seq = None
        rec = Record(seq, op, algorithm, nbytes, dtype, root, peer, time.time_ns())
        if self.enabled:
            self.records.append(rec)
        return rec

    def done(self, rec: Record, note: str | None = None) -> None:
        if note is not None:
            rec.note = note
        rec.state = "completed"
        rec.ended_ns = time.time_ns()
        rec.wait = None
        if self.tracer is not None:
            self.tracer.call(rec)

    def fail(self, rec: Record, exc: BaseException, dump: bool = False, note: str = "") -> None:
        """``rec`` ended with ``exc``; a CommError (or ``dump``) writes the dump when
        TILECOMM_DEBUG_DIR is set."""
        from ..errors import CommError

        rec.state = "failed"
        rec.ended_ns = time.time_ns()
        rec.error = f"{note}{type(exc).__name__}: {exc}"
        dev = _device_record(exc)
        if dev is not None:
            rec.device = dev
            if rec.wait is None:     # the device wait names who this rank waited for
                rec.wait = {"ranks": [dev["peer"]], "phase": f"device wait (site "
                            f"{dev['site']}, epoch {dev['epoch']})", "since_ns": None}
        if self.tracer is not None:
            self.tracer.call(rec)
        if self.debug_dir and (dump or isinstance(exc, CommError)):
            try:
                dump_all(f"{type(exc).__name__} in {rec.op}"
                         f"{'' if rec.seq is None else ' #' + str(rec.seq)}")
            except OSError as e:     # the call's own error is what the caller must see
                import sys
                print(f"tilecomm: could not write the flight record to {self.debug_dir}: {e}",
                      file=sys.stderr)

    def event(self, op: str, note: str) -> Record:
        """A completed record of something this rank did to the communicator itself (abort,
        revoke): ``note`` says who and why. Takes no sequence number."""
        rec = self.issue(op, None, 0, None, ordered=False)
        self.done(rec, note)
        return rec

    def reject(self, op: str, exc: BaseException, announce) -> None:
        """This rank refused its part of call ``op`` (``exc``, a bad argument) and tells its
        peers (``announce()``, which waits for them): the refusal takes a sequence number, as
        the peers' calls at that number fail because of it."""
        rec = self.issue(op, None, None, None)
        try:
            announce()
        except BaseException as e:
            self.fail(rec, e)
            raise
        self.fail(rec, exc, dump=True, note=REJECTED)

    # ---- waits (the channel's hooks; only once a wait has had to block) ---------------------
    def waiting(self, what: tuple, ranks) -> Record | None:
        """The open record that ``what`` = (op, seq, detail) belongs to, now waiting on
        ``ranks``; None if there is none (a wait outside any recorded call)."""
        op, _seq, detail = what
        rec = None
        for i, r in enumerate(reversed(self.records)):   # newest first; a few at most
            if r.state in ("issued", "waiting") and (r.op == op or rec is None):
                rec = r
                if r.op == op:
                    break
            if i >= 16:
                break
        if rec is None:
            return None
        rec.state = "waiting"
        prev = rec.wait
        since = prev["since_ns"] if prev and prev["phase"] == detail else time.time_ns()
        rec.wait = {"ranks": sorted(int(x) for x in ranks), "phase": detail, "since_ns": since}
        return rec

    @staticmethod
    def resumed(rec: Record) -> None:
        if rec.state == "waiting":
            rec.state = "issued"
            rec.wait = None

    # ---- output -------------------------------------------------------------------------------
    def to_json(self) -> dict:
        recs = list(self.records)    # one C-level copy: safe against appends from threads
        return {"id": self.id, "rank": self.rank, "world_size": self.world_size,
                "ranks": list(range(self.world_size)), "capacity": self.capacity,
                "next_seq": self.next_seq, "created_ns": self.created_ns,
                "records": [dict(r.to_json(), group=self.id) for r in recs]}

    def dump(self, path: str | None = None, reason: str = "comm.dump_flight()") -> str:
        """Write every recorder of this process to ``path`` (default
        ``DIR/flight-rank{R}.json`` under TILECOMM_DEBUG_DIR); returns the path."""
        return dump_all(reason, path)


def _device_record(exc) -> dict | None:
    """The device-side wait record a GPU backend's ``DeviceTimeout`` carries."""
    if not all(hasattr(exc, a) for a in ("kernel", "peer", "epoch", "slot", "observed")):
        return None
    return {"kernel": exc.kernel, "rank": int(exc.rank), "peer": int(exc.peer),
            "epoch": int(exc.epoch), "slot": int(exc.slot), "observed": int(exc.observed),
            "site": int(exc.site), "count": int(exc.count),
            "device_call": int(getattr(exc, "seq", -1))}


# ---- the process's dump -------------------------------------------------------------------------
class HostLeg:
    """The wait hooks of a host's own communicator inside a communicator that spans hosts
    (``hier/``): its waits are recorded on the enclosing call, with global ranks, and it is
    not dumped on its own (its ranks and sequence numbers are the host's, which would collide
    with the other hosts' in one directory)."""

    def __init__(self, outer: FlightRecorder, ranks):
        self.outer, self.ranks = outer, tuple(ranks)

    def waiting(self, what: tuple, ranks) -> Record | None:
        op, seq, detail = what
        return self.outer.waiting((op, seq, f"inside the host, {op} #{seq}: {detail}"),
                                  [self.ranks[r] for r in ranks])

    resumed = staticmethod(FlightRecorder.resumed)


def adopt_host_leg(local_flight: FlightRecorder, outer: FlightRecorder, ranks) -> HostLeg:
    """Stop dumping ``local_flight`` (a host's communicator); its waits go to ``outer``."""
    _recorders.pop(local_flight.id, None)
    return HostLeg(outer, ranks)


def live() -> list[FlightRecorder]:
    return [r for _, r in sorted(_recorders.items())]


def process_rank() -> tuple[int, int]:
    """(rank, world size) that names this process's dump: torchrun's RANK/WORLD_SIZE, else the
    oldest live communicator's."""
    recs = live()
    if "RANK" in os.environ and "WORLD_SIZE" in os.environ:
        return int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    if recs:
        return recs[0].rank, recs[0].world_size
    return 0, 1


def dump_path(directory: str, rank: int) -> str:
    return os.path.join(directory, f"flight-rank{rank}.json")


def dump_all(reason: str, path: str | None = None) -> str:
    """Write this process's recorders (and flush its traces) as one JSON file, atomically."""
    with _dump_lock:
        return _dump(reason, path)


def _dump(reason: str, path: str | None) -> str:
    from ..settings import settings

    rank, world = process_rank()
    if path is None:
        directory = settings().debug_dir
        if not directory:
            raise ValueError("dump_flight: no path given and TILECOMM_DEBUG_DIR is not set")
        path = dump_path(directory, rank)
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    recs = live()
    doc = {"format": FORMAT, "host": socket.gethostname(), "pid": os.getpid(), "rank": rank,
           "world_size": world, "reason": reason, "written_ns": time.time_ns(),
           "comms": [r.to_json() for r in recs]}
    tmp = f"{path}.{os.getpid()}.{threading.get_native_id()}.tmp"
    with open(tmp, "w") as f:
        json.dump(doc, f)
    os.replace(tmp, path)
    for r in recs:
        if r.tracer is not None:
            r.tracer.flush()
    return path


def _dump_from_handler(reason: str) -> None:
    """A dump from a signal handler: skipped when this thread is writing one right now, and
    never raising into the code the signal interrupted."""
    if _dump_lock.acquire(blocking=False):
        try:
            _dump(reason, None)
        except Exception:  # noqa: BLE001 - a signal handler must not raise into user code
            pass
        finally:
            _dump_lock.release()


def _on_sigusr1(signum, frame) -> None:
    _dump_from_handler("SIGUSR1")
    prev = _previous[0]
    if callable(prev):
        prev(signum, frame)


_previous: list = [None]
_previous_term: list = [None]


def dump_on_sigterm() -> None:
    """Write the flight record when this process is told to stop (SIGTERM), then stop as it
    would have: torchrun stops every other rank of a job with SIGTERM (then SIGKILL) as soon
    as one fails, before they notice the dead peer, so without this a crash left no record at
    all. Main thread only; a handler the program installed runs after the dump."""
    _install(signal.SIGTERM, _on_sigterm, _previous_term, _term_installed)


def _on_sigterm(signum, frame) -> None:
    _dump_from_handler("SIGTERM: told to stop (torchrun stops the ranks when one fails)")
    prev = _previous_term[0]
    if callable(prev):
        prev(signum, frame)
    elif prev != signal.SIG_IGN:          # the default: end by SIGTERM, as before
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGTERM)


def _install_handler() -> None:
    """SIGUSR1 dumps (main thread only; chains a Python handler that was there)."""
    _install(signal.SIGUSR1, _on_sigusr1, _previous, _handler_installed)


def _install(sig, handler, previous: list, installed: list) -> None:
    """Install ``handler`` for ``sig`` once (main thread only), keeping the one before in
    ``previous[0]``; ``installed[0]`` says it is done."""
    if installed[0] or threading.current_thread() is not threading.main_thread():
        return
    try:
        previous[0] = signal.signal(sig, handler)
    except (ValueError, OSError):
        return
    installed[0] = True


def _after_fork() -> None:
    # a forked rank must not dump its parent's communicators as its own, nor inherit a lock
    # a parent thread held
    global _dump_lock
    _recorders.clear()
    _next_id[0] = 0
    _dump_lock = threading.Lock()


os.register_at_fork(after_in_child=_after_fork)


# ---- the launcher's side ------------------------------------------------------------------------
def request_dumps(pids: dict[int, int], directory: str, wait: float = 1.0) -> list[int]:
    """Ask rank processes (rank -> pid) to dump (SIGUSR1) and wait up to ``wait`` seconds for
    their files; returns the ranks that wrote one. A stopped process (SIGSTOP) is not waited
    for: it cannot run its handler."""
    t0 = time.time_ns()
    asked = {}
    for rank, pid in pids.items():
        try:
            os.kill(pid, signal.SIGUSR1)
        except (ProcessLookupError, PermissionError):
            continue
        if not _stopped(pid):
            asked[rank] = pid
    wrote, deadline = [], time.monotonic() + wait
    while asked and time.monotonic() < deadline:
        for rank in list(asked):
            try:
                fresh = os.stat(dump_path(directory, rank)).st_mtime_ns >= t0
            except FileNotFoundError:
                fresh = False
            if fresh:
                wrote.append(rank)
                del asked[rank]
        if asked:
            time.sleep(0.01)
    return sorted(wrote)


def _stopped(pid: int) -> bool:
    return procfs.state(pid) in procfs.STOPPED + procfs.ENDED

"""Chrome traces (the JSON that Perfetto and chrome://tracing load), per rank and merged.

With ``TILECOMM_TRACE=DIR`` each rank process keeps one :class:`Tracer` and writes
``DIR/trace-rank{R}.json``: ``{"traceEvents": [...], "tilecomm": {...}}`` where every event is
a complete event (``"ph": "X"``, ``ts``/``dur`` in microseconds, ``pid`` = rank, ``tid`` = the
thread's native id):

    all_reduce            one per call (cat "collective"; args op, algorithm, bytes, seq,
                          dtype, state, and the error when it failed)
      handshake           the descriptor exchange of a host-executor call     (cat "phase")
      phase p             one per schedule phase and piece (args piece, waits) (cat "phase")
        wait rank j       how long this rank waited for peer j             (cat "wait")

Children lie inside their parents on the same thread (waits of one phase all start when the
wait starts, so they nest by length). GPU collectives return once launched, so their events
cover the host side; on CUDA they are also NVTX ranges (``tilecomm <op>/<algorithm>``) that
Nsight Systems lines up with the kernels.

Timestamps are ``time.time_ns``; each file's ``ts`` count from its ``base_ns``. The rank also
notes ``sync_ns``, the moment it left the handshake every rank makes when the communicator is
created (the executor's ``init`` rendezvous). :func:`merge` shifts every host's ranks so that
the hosts' rendezvous moments coincide (NOTE [clock alignment]: ranks of one host keep their
shared clock; across hosts the offset is removed to within how long the last arrival takes to
be seen) and writes one file with one process per rank (``process_name`` metadata events).

Files are written when the communicator closes, when the flight recorder dumps, when a
``tilecomm.launch`` rank exits and at interpreter exit.
"""

from __future__ import annotations

import atexit
import json
import os
import socket
import threading
import time

#: events kept per process; later ones are counted in ``dropped`` (a long run stays bounded)
MAX_EVENTS = 1_000_000

_tracer: list = [None]


class Tracer:
    """The trace of one rank process (shared by its communicators)."""

    def __init__(self, directory: str, rank: int, world_size: int):
        self.directory, self.rank, self.world_size = directory, rank, world_size
        self.base_ns = time.time_ns()
        self.sync_ns: int | None = None
        self.events: list[tuple] = []   # (name, cat, t0_ns, t1_ns, tid, args)
        self.dropped = 0
        self.threads: dict[int, str] = {}
        self._lock = threading.Lock()

    def _add(self, name, cat, t0, t1, args) -> None:
        tid = threading.get_native_id()
        if tid not in self.threads:
            self.threads[tid] = threading.current_thread().name
        if len(self.events) >= MAX_EVENTS:
            self.dropped += 1
            return
        self.events.append((name, cat, t0, t1, tid, args))

    # ---- what the layers report ----------------------------------------------------------------
    def synced(self, t0: int) -> None:
        """This rank just left the creation handshake (the alignment point), which it entered
        at ``t0``: noted once, and shown as the call ``init`` #0."""
        if self.sync_ns is None:
            self.sync_ns = time.time_ns()
            self._add("init", "collective", t0, self.sync_ns,
                      {"op": "init", "algorithm": None, "bytes": 0, "seq": 0, "dtype": None,
                       "state": "completed"})

    def call(self, rec) -> None:
        """A finished flight record becomes the call's complete event."""
        args = {"op": rec.op, "algorithm": rec.algorithm, "bytes": rec.nbytes, "seq": rec.seq,
                "dtype": rec.dtype, "state": rec.state}
        if rec.peer is not None:
            args["peer"] = rec.peer
        if rec.error:
            args["error"] = rec.error
        self._add(rec.op, "collective", rec.issued_ns, rec.ended_ns, args)

    def span(self, name: str, t0: int, args: dict) -> None:
        """A phase that started at ``t0`` (``time.time_ns``) and ends now."""
        self._add(name, "phase", t0, time.time_ns(), args)

    def wait(self, peer: int, t0: int, what: tuple) -> None:
        """This rank waited from ``t0`` until now for ``peer``; ``what`` = (op, seq, detail)."""
        op, seq, detail = what
        self._add(f"wait rank {peer}", "wait", t0, time.time_ns(),
                  {"peer": peer, "op": op, "seq": seq, "for": detail})

    # ---- output --------------------------------------------------------------------------------
    def path(self) -> str:
        return os.path.join(self.directory, f"trace-rank{self.rank}.json")

    def to_json(self) -> dict:
        base = self.base_ns
        events = []
        for tid, tname in sorted(self.threads.items()):
            events.append({"name": "thread_name", "ph": "M", "pid": self.rank, "tid": tid,
                           "args": {"name": tname}})
        for name, cat, t0, t1, tid, args in list(self.events):
            events.append({"name": name, "cat": cat, "ph": "X", "pid": self.rank, "tid": tid,
                           "ts": (t0 - base) / 1000.0, "dur": max(0, t1 - t0) / 1000.0,
                           "args": args})
        return {"traceEvents": events, "displayTimeUnit": "ms",
                "tilecomm": {"rank": self.rank, "world_size": self.world_size,
                             "host": socket.gethostname(), "pid": os.getpid(),
                             "base_ns": base, "sync_ns": self.sync_ns,
                             "dropped": self.dropped}}

    def flush(self) -> str:
        """Write this rank's file (atomically; again later with the events since)."""
        with self._lock:
            os.makedirs(self.directory, exist_ok=True)
            doc = self.to_json()
            tmp = f"{self.path()}.{os.getpid()}.tmp"
            with open(tmp, "w") as f:
                json.dump(doc, f)
            os.replace(tmp, self.path())
            return self.path()


def process_tracer(directory: str, rank: int, world_size: int) -> Tracer:
    """The tracer of this process (made by its first communicator)."""
    t = _tracer[0]
    if t is None or t.directory != directory:
        if "RANK" in os.environ and "WORLD_SIZE" in os.environ:   # torchrun: the job's rank
            rank, world_size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
        t = _tracer[0] = Tracer(directory, rank, world_size)
    return t


def flush() -> None:
    """Write this process's trace, if it keeps one (the launcher's ranks call it at exit)."""
    t = _tracer[0]
    if t is not None:
        try:
            t.flush()
        except OSError:
            pass


atexit.register(flush)
os.register_at_fork(after_in_child=lambda: _tracer.__setitem__(0, None))


# ---- merging ------------------------------------------------------------------------------------
def load_ranks(directory: str) -> dict[int, dict]:
    """The per-rank trace files of ``directory`` (rank -> document)."""
    from . import load_rank_files

    def valid(doc):
        if "traceEvents" not in doc or "tilecomm" not in doc:
            return "not a tilecomm trace (no traceEvents/tilecomm keys)"
        return None
    return load_rank_files(directory, "trace-rank", valid,
                           f"run with TILECOMM_TRACE={directory} (or tilecomm bench --trace)")


def merge(directory: str, out: str | None = None) -> dict:
    """One trace of every rank in ``directory``, clocks aligned at the creation handshake;
    written to ``out`` when given. Returns the merged document."""
    docs = load_ranks(directory)
    # NOTE [clock alignment]: the ranks of one host share its clock, so they get one shift
    # (aligning each rank at its own departure would skew them by how late each saw the last
    # arrival: milliseconds when ranks outnumber cores). A host's estimate of the rendezvous
    # is its earliest departure (every departure follows the last arrival); hosts are shifted
    # so that these coincide. A rank without a handshake uses its trace's start.
    marks: dict[str, int] = {}
    for doc in docs.values():
        meta = doc["tilecomm"]
        sync = meta.get("sync_ns")
        mark = sync if sync is not None else meta["base_ns"]
        marks[meta["host"]] = min(marks.get(meta["host"], mark), mark)
    shifts = {r: -marks[d["tilecomm"]["host"]] for r, d in docs.items()}
    events, origin = [], None
    for r, doc in sorted(docs.items()):
        meta = doc["tilecomm"]
        for e in doc["traceEvents"]:
            if e.get("ph") == "X":
                t = meta["base_ns"] + e["ts"] * 1000.0 + shifts[r]
                origin = t if origin is None else min(origin, t)
    origin = origin or 0.0
    for r, doc in sorted(docs.items()):
        meta = doc["tilecomm"]
        events.append({"name": "process_name", "ph": "M", "pid": r, "tid": 0,
                       "args": {"name": f"rank {r} ({meta['host']} pid {meta['pid']})"}})
        events.append({"name": "process_sort_index", "ph": "M", "pid": r, "tid": 0,
                       "args": {"sort_index": r}})
        for e in doc["traceEvents"]:
            e = dict(e, pid=r)
            if e.get("ph") == "X":
                t = meta["base_ns"] + e["ts"] * 1000.0 + shifts[r]
                e["ts"] = (t - origin) / 1000.0
            events.append(e)
    merged = {"traceEvents": events, "displayTimeUnit": "ms",
              "otherData": {"tilecomm_ranks": sorted(docs),
                            "aligned_at": "communicator creation handshake",
                            "unaligned": sorted(r for r, d in docs.items()
                                                if d["tilecomm"].get("sync_ns") is None),
                            "dropped": {r: d["tilecomm"].get("dropped", 0)
                                        for r, d in docs.items()}}}
    if out:
        with open(out, "w") as f:
            json.dump(merged, f)
    return merged

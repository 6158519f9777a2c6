"""Symbolic checker: proves a schedule delivers what its collective promises.

Every input chunk is a token ``(rank, buffer, chunk)``; a location holds the set of tokens reduced
into it. Running the moves symbolically, the checker rejects

* reading a location that holds nothing defined (uninitialised scratch),
* reducing two values that share a token (a contribution counted twice),
* a phase in which a location written by one rank is read by another (a race under the
  synchronization rule of ``schedule.py``), or in which a rank writes a peer's buffer,
* moves naming unknown buffers or chunks,

and at the end compares every output location with the collective's postcondition
(``collectives.py``). A schedule that passes is correct for any data and any timing allowed by the
synchronization rule.
"""

from __future__ import annotations

from .collectives import COLLECTIVES
from .schedule import Schedule


class ScheduleError(AssertionError):
    """A schedule violates its collective's contract; the message says where."""


def check_schedule(sched: Schedule) -> None:
    """Raise :class:`ScheduleError` unless ``sched`` is a correct, race-free schedule (and so is
    its aliased form, when a scratch buffer may share another buffer's storage)."""
    _check(sched)
    folded = sched.aliased()
    if folded is not sched:
        try:
            _check(folded)
        except ScheduleError as e:
            raise ScheduleError(f"with aliased buffers: {e}") from None


def _check(sched: Schedule) -> None:
    spec = COLLECTIVES[sched.collective]
    w = sched.world_size
    name = f"{sched.collective}/{sched.algo} (world_size={w}, root={sched.root})"
    nchunks = {b.name: b.nchunks for b in sched.buffers}
    for b in sched.buffers:
        if b.like is not None and nchunks.get(b.like) != b.nchunks:
            raise ScheduleError(f"{name}: buffer {b.name} is like {b.like} but has "
                                f"{b.nchunks} chunks")

    state: dict[tuple[int, str, int], frozenset | None] = {}
    for r in range(w):
        for buf, n in nchunks.items():
            for c in range(n):
                state[(r, buf, c)] = (frozenset({(r, buf, c)}) if buf in spec.inputs else None)

    for p, moves in enumerate(sched.phases):
        written: dict[tuple[int, str, int], int] = {}
        for m in moves:
            for loc in (m.dst, m.src):
                if loc.buf not in nchunks or not 0 <= loc.chunk < nchunks[loc.buf]:
                    raise ScheduleError(f"{name}: phase {p}: {m} names {loc} which the schedule "
                                        f"does not declare")
            if not (0 <= m.rank < w and 0 <= m.src_rank < w):
                raise ScheduleError(f"{name}: phase {p}: {m} names a rank outside 0..{w - 1}")
            src_key = (m.src_rank, m.src.buf, m.src.chunk)
            writer = written.get(src_key)
            if writer is not None and writer != m.rank:
                raise ScheduleError(f"{name}: phase {p}: rank {m.rank} reads {src_key} while "
                                    f"rank {writer} writes it in the same phase")
            dst_key = (m.rank, m.dst.buf, m.dst.chunk)
            for other in moves:
                if (other.rank != m.rank and (other.src_rank, other.src.buf, other.src.chunk)
                        == dst_key):
                    raise ScheduleError(f"{name}: phase {p}: rank {other.rank} reads {dst_key} "
                                        f"while rank {m.rank} writes it in the same phase")
            written[dst_key] = m.rank
            val = state[src_key]
            if val is None:
                raise ScheduleError(f"{name}: phase {p}: rank {m.rank} reads undefined "
                                    f"{src_key}")
            if m.reduce:
                old = state[dst_key]
                if old is None:
                    raise ScheduleError(f"{name}: phase {p}: rank {m.rank} reduces into "
                                        f"undefined {dst_key}")
                if old & val:
                    raise ScheduleError(f"{name}: phase {p}: rank {m.rank} counts "
                                        f"{sorted(old & val)} twice in {dst_key}")
                if not spec.reduces:
                    raise ScheduleError(f"{name}: phase {p}: {sched.collective} does not reduce")
                state[dst_key] = old | val
            else:
                state[dst_key] = val

    for r in range(w):
        for buf, n in nchunks.items():
            if buf not in spec.outputs:
                continue
            for c in range(n):
                want = spec.expected(sched, r, buf, c)
                got = state[(r, buf, c)]
                if want is not None and got != want:
                    raise ScheduleError(f"{name}: rank {r} ends with {buf}[{c}] = "
                                        f"{_fmt(got)}, expected {_fmt(want)}")


def _fmt(v) -> str:
    if v is None:
        return "undefined"
    return "{" + ", ".join(f"r{r}.{b}[{c}]" for r, b, c in sorted(v)) + "}"

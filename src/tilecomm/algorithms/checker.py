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
        writers: dict[tuple[int, str, int], int] = {}
        for m in moves:
            for loc in (m.dst, m.src):
                if loc.buf not in nchunks or not 0 <= loc.chunk < nchunks[loc.buf]:
                    raise ScheduleError(f"{name}: phase {p}: {m} names {loc} which the schedule "
                                        f"does not declare")
            if not (0 <= m.rank < w and 0 <= m.src_rank < w):
                raise ScheduleError(f"{name}: phase {p}: {m} names a rank outside 0..{w - 1}")
            writers[(m.rank, m.dst.buf, m.dst.chunk)] = m.rank
        for m in moves:
            src_key = (m.src_rank, m.src.buf, m.src.chunk)
            writer = writers.get(src_key)
            if writer is not None and writer != m.rank:
                raise ScheduleError(f"{name}: phase {p}: rank {m.rank} reads {src_key} while "
                                    f"rank {writer} writes it in the same phase")
        # Ranks do not race (checked above), so they may run one after another; within a rank
        # reductions run in order, each reading all its sources before writing (NOTE
        # [reductions] in schedule.py).
        for r in range(w):
            for red in sched.reductions_of(r, p):
                dst_key = (r, red.dst.buf, red.dst.chunk)
                vals = []
                if red.accumulate:
                    old = state[dst_key]
                    if old is None:
                        raise ScheduleError(f"{name}: phase {p}: rank {r} reduces into "
                                            f"undefined {dst_key}")
                    vals.append(old)
                for sr, loc in red.srcs:
                    val = state[(sr, loc.buf, loc.chunk)]
                    if val is None:
                        raise ScheduleError(f"{name}: phase {p}: rank {r} reads undefined "
                                            f"{(sr, loc.buf, loc.chunk)}")
                    vals.append(val)
                if len(vals) > 1 and not spec.reduces:
                    raise ScheduleError(f"{name}: phase {p}: {sched.collective} does not reduce")
                acc = vals[0]
                for val in vals[1:]:
                    if acc & val:
                        raise ScheduleError(f"{name}: phase {p}: rank {r} counts "
                                            f"{sorted(acc & val)} twice in {dst_key}")
                    acc = acc | val
                state[dst_key] = acc

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

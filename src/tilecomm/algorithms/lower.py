"""Lowering: one rank's share of a schedule as a backend-neutral *plan*.

A schedule (``schedule.py``) says what every rank moves in every phase. Each engine needs the
same thing from it, per rank: the reductions to perform in each phase (in their fixed
reduction order), the ranks to wait for before each phase and at the end, the ranks to tell
after each phase (engines whose signals are *pushed*, like the GPU device API) and the
element bounds of every chunk. This module computes that once, so that

* the CPU executor (``backends/cpu``),
* the generic GPU plan kernel (``backends/triton/kernels/plan.py``), and
* the simulator and the CPU cost model (``sim/``)

all consume one :class:`RankPlan` and cannot drift apart. Plans are place-independent: where a
buffer lives (caller's memory, scratch, the symmetric heap) is each engine's business (the CPU
executor's: ``backends/cpu/placement.py``, which the CPU cost model reads too).

NOTE [reduction order]
    A :class:`PlanOp` combines its operands left to right in the order the schedule lists them
    (NOTE [reductions] in ``schedule.py``), accumulating 16-bit floats in float32 and rounding
    once when it writes its destination. An op whose result holds every rank's contribution
    (``completes``) also applies ``avg``'s division before rounding. :func:`rank_ordered` tells
    whether a schedule therefore returns the bits of the rank-order reference (float32
    accumulation in rank order 0..W-1, one rounding): the deterministic mode runs only those.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from typing import Sequence

from .collectives import COLLECTIVES, chunk_lengths
from .registry import get_schedule
from .schedule import Reduction, Schedule

#: buffers the caller passes (the rest are scratch the engine provides)
USER_BUFFERS = ("buf", "in", "out")


@dataclass(frozen=True)
class PlanOp(Reduction):
    """One of the schedule's reductions (``dst (=|op=) srcs[0] op srcs[1] ...``, NOTE
    [reduction order]) as this rank executes it, plus ``completes``: the result holds every
    rank's contribution (``avg`` divides here)."""

    completes: bool = False


@dataclass(frozen=True)
class PlanPhase:
    """One phase of a rank's plan: wait for ``waits`` (they finished the previous phase, or
    arrived, for the first), do ``ops`` in order, then tell ``notify`` (the ranks whose next
    wait, or end wait, names this rank)."""

    waits: tuple[int, ...]
    ops: tuple[PlanOp, ...]
    notify: tuple[int, ...]


@dataclass(frozen=True)
class RankPlan:
    """One rank's lowered schedule (built once per ``(collective, algo, world, root, rank)``)."""

    sched: Schedule
    rank: int
    phases: tuple[PlanPhase, ...]
    end_waits: tuple[int, ...]              # ranks to wait for before returning
    names: tuple[str, ...]                  # buffer names in schedule (descriptor) order
    lead: int                               # leading phases without remote reads (any rank)

    @property
    def collective(self) -> str:
        return self.sched.collective

    @property
    def algo(self) -> str:
        return self.sched.algo

    @property
    def world_size(self) -> int:
        return self.sched.world_size

    def chunk_lengths(self, buf: str, count: int, counts=None, rank: int | None = None
                      ) -> list[int]:
        """Element length of every chunk of ``rank``'s (default: this rank's) buffer ``buf``
        for a call of ``count`` elements (``counts``: all_to_all_v's element matrix)."""
        r = self.rank if rank is None else rank
        return chunk_lengths(self.sched, r, buf, count, counts)


@lru_cache(maxsize=1024)
def lower(collective: str, algo: str, world_size: int, root: int, rank: int) -> RankPlan:
    """The plan of ``rank`` for the registered schedule ``collective/algo``."""
    sched = get_schedule(collective, algo, world_size, root)
    return lower_schedule(sched, rank)


def lower_schedule(sched: Schedule, rank: int) -> RankPlan:
    """The plan of ``rank`` for any (checked) schedule."""
    done = _memo(sched, "completing", _completing)
    waits, notify = _memo(sched, "waits", _wait_tables)
    phases = tuple(
        PlanPhase(waits[p][rank],
                  tuple(PlanOp(red.dst, red.srcs, red.accumulate, (p, rank, i) in done)
                        for i, red in enumerate(sched.reductions_of(rank, p))),
                  notify[p][rank])
        for p in range(len(sched.phases)))
    names = tuple(b.name for b in sched.buffers)
    return RankPlan(sched, rank, phases, tuple(sorted(sched.waits_at_end(rank))), names,
                    sched.leading_local_phases)


def _memo(sched: Schedule, key: str, fn):
    """``fn(sched)`` computed once per schedule object (kept in its ``__dict__``, as the
    schedule's own cached properties are: hashing a large schedule for an lru_cache costs
    more than lowering one rank)."""
    d = sched.__dict__.setdefault("_lowering", {})
    if key not in d:
        d[key] = fn(sched)
    return d[key]


def _wait_tables(sched: Schedule):
    """``waits[p][r]`` (sorted ranks ``r`` waits for before phase ``p``) and ``notify[p][r]``
    (ranks that wait for ``r`` after its phase ``p``: before their phase ``p + 1``, or at
    their end after the last phase), for every rank at once."""
    w, nph = sched.world_size, len(sched.phases)
    waits = [[tuple(sorted(sched.waits_before(r, p))) for r in range(w)] for p in range(nph)]
    ends = [sched.waits_at_end(r) for r in range(w)]
    notify = []
    for p in range(nph):
        told = [[] for _ in range(w)]
        for q in range(w):
            for r in (waits[p + 1][q] if p + 1 < nph else sorted(ends[q])):
                if r != q:
                    told[r].append(q)
        notify.append([tuple(sorted(t)) for t in told])
    return waits, notify


# ---- what the reductions compute ------------------------------------------------------------
def _symbolic(sched: Schedule):
    """Run the schedule on symbolic values: ``(ranks in combination order, exact)`` per location,
    where ``exact`` means one reduction of untouched inputs produced it (copies keep it).
    Yields ``(phase, rank, op index, value written)`` and returns the final state."""
    spec = COLLECTIVES[sched.collective]
    w = sched.world_size
    state: dict = {}
    for r in range(w):
        for b in sched.buffers:
            for c in range(b.nchunks):
                state[(r, b.name, c)] = ((r,), True) if b.name in spec.inputs else None
    events = []
    for p in range(len(sched.phases)):
        for r in range(w):
            for i, red in enumerate(sched.reductions_of(r, p)):
                key = (r, red.dst.buf, red.dst.chunk)
                vals = ([state[key]] if red.accumulate else []) + \
                    [state[(sr, loc.buf, loc.chunk)] for sr, loc in red.srcs]
                if any(v is None for v in vals):
                    raise ValueError(f"{sched.collective}/{sched.algo}: reads undefined data "
                                     f"(run the checker)")
                if len(vals) == 1:
                    val = vals[0]
                else:
                    order = tuple(x for v in vals for x in v[0])
                    val = (order, all(len(v[0]) == 1 for v in vals))
                state[key] = val
                events.append((p, r, i, val, len(vals) > 1))
    return events, state


def _completing(sched: Schedule) -> frozenset:
    """``(phase, rank, op index)`` of every reduction whose result holds all ranks' data."""
    if not COLLECTIVES[sched.collective].reduces or sched.world_size < 2:
        return frozenset()
    events, _ = _symbolic(sched)
    w = sched.world_size
    return frozenset((p, r, i) for p, r, i, val, reduced in events
                     if reduced and len(set(val[0])) == w)


@lru_cache(maxsize=1024)
def rank_ordered(collective: str, algo: str, world_size: int, root: int = 0) -> bool:
    """Whether ``collective/algo`` returns the bits of the rank-order reference on every rank
    and output (NOTE [reduction order]): each reduced output is made by one reduction of the
    untouched inputs of ranks 0, 1, ..., W-1 in that order, then only copied."""
    sched = get_schedule(collective, algo, world_size, root)
    spec = COLLECTIVES[sched.collective]
    if not spec.reduces:
        return True
    _, state = _symbolic(sched)
    want = tuple(range(world_size))
    for b in sched.buffers:
        if b.name not in spec.outputs:
            continue
        for r in range(world_size):
            for c in range(b.nchunks):
                exp = spec.expected(sched, r, b.name, c)
                if exp is None or len(exp) < 2:
                    continue
                val = state[(r, b.name, c)]
                if val is None or val[0] != want or not val[1]:
                    return False
    return True


def deterministic_algorithms(collective: str, world_size: int, root: int = 0,
                             among: Sequence[str] | None = None) -> list[str]:
    """The registered algorithms of ``collective`` that :func:`rank_ordered` accepts."""
    from .registry import algorithms

    registered = algorithms(collective)
    names = registered if among is None else [a for a in among if a in registered]
    return [a for a in names if rank_ordered(collective, a, world_size, root)]


# ---- pieces (large messages run in slices of every chunk) -----------------------------------
def piece_elems(plan: RankPlan, itemsize: int, half_bytes: int | None) -> int:
    """Elements each chunk contributes to one piece when a piece may use ``half_bytes`` of
    scratch (0: no limit, one piece). Depends only on the schedule and the settings, so every
    rank computes the same value."""
    if not plan.nslots or not half_bytes:
        return 0
    piece = (half_bytes // itemsize) // plan.nslots
    if piece < 1:
        raise ValueError("TILECOMM_SCRATCH_BYTES is too small for this world size")
    return piece


def piece_len(chunk: int, k: int, piece: int) -> int:
    """Elements of a ``chunk``-element chunk that fall in piece ``k`` (``piece`` 0: one piece)."""
    if not piece:
        return chunk if k == 0 else 0
    return max(0, min(piece, chunk - k * piece))

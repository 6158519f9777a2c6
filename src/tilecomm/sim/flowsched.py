"""Flow schedules: a :class:`~tilecomm.algorithms.Schedule` reduced to what costs time.

Built from the schedule's lowered plans (``algorithms/lower.py``), the same
:class:`~tilecomm.algorithms.lower.RankPlan` s the executors run: a phase keeps, per executing
rank, one *flow* per source rank (the chunks its plan ops read from that source merged), with
its size as a fraction of the message (``frac * nbytes`` bytes) and whether it reduces. The
engines release a rank's phase by the synchronization rule applied to the flows, which gives
exactly the plan's ``waits`` (tested for every registered algorithm). ``repeat`` says the same
phase occurs that many times in a row (a ring's 2(W-1) steps are one phase repeated), which
keeps an 8,192-rank ring at a few arrays instead of 10^8 moves.

Lowering costs a symbolic run of the schedule per rank (``lower.py`` derives each op's
``completes``), so registered schedules are lowered once per process
(:func:`from_registered`).

Message size follows nccl-tests: ``nbytes`` is the buffer for all_reduce/broadcast/reduce, the
*output* of all_gather, the *input* of reduce_scatter and all_to_all.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import lru_cache
from typing import Sequence

import numpy as np

from tilecomm.algorithms import Schedule
from tilecomm.algorithms.collectives import buffer_totals
from tilecomm.algorithms.lower import RankPlan, lower_schedule
from tilecomm.algorithms.registry import get_schedule


@dataclass
class FlowPhase:
    dst: np.ndarray      # executing (receiving) rank of each flow
    src: np.ndarray      # rank read from (== dst for a local copy)
    frac: np.ndarray     # bytes / nbytes
    reduce: np.ndarray   # bool: the data is reduced into the destination
    repeat: int = 1

    def __post_init__(self):
        self.dst = np.asarray(self.dst, dtype=np.int64)
        self.src = np.asarray(self.src, dtype=np.int64)
        self.frac = np.asarray(self.frac, dtype=float)
        self.reduce = np.asarray(self.reduce, dtype=bool)


@dataclass
class FlowSchedule:
    collective: str
    algo: str
    world_size: int
    phases: list[FlowPhase]
    notes: str = ""
    meta: dict = field(default_factory=dict)

    @property
    def num_steps(self) -> int:
        return sum(p.repeat for p in self.phases)

    def num_flows(self) -> int:
        return sum(len(p.dst) * p.repeat for p in self.phases)

    def expanded(self) -> list[FlowPhase]:
        return [p for p in self.phases for _ in range(p.repeat)]


def _count_per_nbyte(collective: str, w: int) -> float:
    """Caller's element count per byte of ``nbytes`` (1-byte elements; nccl-tests sizes)."""
    return 1.0 / w if collective == "all_gather" else 1.0


def from_schedule(sched: Schedule) -> FlowSchedule:
    """Flows of a schedule (one per (phase, rank, source)), from its lowered plans."""
    return from_plans(model_plans(sched))


def from_registered(collective: str, algo: str, world_size: int, root: int = 0) -> FlowSchedule:
    """Flows of the registered ``collective/algo`` (its plans are lowered once per process)."""
    return from_plans(_registered_plans(collective, algo, world_size, root))


def model_plans(sched: Schedule) -> tuple[RankPlan, ...]:
    """Every rank's plan of ``sched`` as the model runs it. The model assumes buffers in
    symmetric memory (registered, as on the GPU heap): a scratch buffer that may alias its
    user buffer does, so staging copies are not data movement."""
    sched = sched.aliased()
    return tuple(lower_schedule(sched, r) for r in range(sched.world_size))


@lru_cache(maxsize=64)
def _registered_plans(collective: str, algo: str, world_size: int, root: int
                      ) -> tuple[RankPlan, ...]:
    return model_plans(get_schedule(collective, algo, world_size, root))


def from_plans(plans: Sequence[RankPlan], chunk_frac: float | None = None) -> FlowSchedule:
    """Aggregate every rank's plan (``plans[r]`` is rank ``r``'s, all of one schedule) into
    flows: per phase and rank, each source ``(src_rank, chunk)`` of each :class:`PlanOp` adds
    that chunk's bytes to the flow ``src_rank -> rank`` (a local source: a local copy); the
    flow reduces if any of its operands is combined into the destination.

    A chunk's bytes follow from the collective's buffer layout (``collectives.py``), or are
    ``chunk_frac * nbytes`` for every buffer when given (a flattened hierarchical plan, whose
    scratch buffers the collective's layout does not name: ``sim/hierflows.py``)."""
    sched = plans[0].sched
    w = sched.world_size
    assert len(plans) == w and all(pl.rank == r and pl.sched is sched
                                   for r, pl in enumerate(plans)), "one plan per rank"
    coll = sched.collective
    if chunk_frac is not None:
        frac_of = {b.name: chunk_frac for b in sched.buffers}
    elif coll == "barrier":
        frac_of = {}
    else:
        # Buffer totals are linear in count: evaluate at a large count and scale.
        big = 1 << 40
        count = big * _count_per_nbyte(coll, w)
        totals = buffer_totals(coll, w, int(count))
        frac_of = {b.name: totals[b.like or b.name] / big / sched.buffer(b.like or b.name).nchunks
                   for b in sched.buffers}
    phases = []
    for p in range(len(sched.phases)):
        agg: dict[tuple[int, int], list] = {}
        for r, plan in enumerate(plans):
            for op in plan.phases[p].ops:
                for i, (src_rank, loc) in enumerate(op.srcs):
                    # The operand is combined into dst unless it is a fresh reduction's first.
                    red = op.accumulate if i == 0 else True
                    key = (r, src_rank)
                    f = frac_of.get(loc.buf, 0.0)
                    if key in agg:
                        agg[key][0] += f
                        agg[key][1] |= red
                    else:
                        agg[key] = [f, red]
        keys = list(agg)
        ph = FlowPhase([k[0] for k in keys], [k[1] for k in keys],
                       [agg[k][0] for k in keys], [agg[k][1] for k in keys])
        if phases and _same(phases[-1], ph):
            phases[-1].repeat += 1
        else:
            phases.append(ph)
    return FlowSchedule(coll, sched.algo, w, phases, notes=sched.notes)


def _same(a: FlowPhase, b: FlowPhase) -> bool:
    return (len(a.dst) == len(b.dst) and np.array_equal(a.dst, b.dst)
            and np.array_equal(a.src, b.src) and np.allclose(a.frac, b.frac)
            and np.array_equal(a.reduce, b.reduce))

"""The simulator's flows come from the lowered plans (algorithms/lower.py) and are exactly the
flows the schedule's moves gave before (the reference below is the pre-plan ``from_schedule``)."""

import numpy as np
import pytest

from tilecomm.algorithms import all_algorithms, get_schedule
from tilecomm.algorithms.collectives import buffer_totals
from tilecomm.sim import from_plans, from_registered, from_schedule, simulate_events
from tilecomm.sim.flowsched import FlowPhase, _count_per_nbyte, _same, model_plans
from tilecomm.topology import build

WORLDS = (1, 2, 3, 4, 5, 8)


def _registered(w):
    """Every registered schedule at ``w`` ranks with a fixed layout (all_to_all_v's chunks
    depend on the call's count matrix: the simulator has no flows for it, before or now)."""
    for coll, algo in all_algorithms():
        if coll == "all_to_all_v":
            continue
        try:
            yield coll, algo, get_schedule(coll, algo, w)
        except ValueError:       # not defined at this world size
            continue


def _flows_from_moves(sched):
    """Flows straight from ``Schedule.phases`` (one per (phase, rank, source), in move order)."""
    sched = sched.aliased()
    w, coll = sched.world_size, sched.collective
    frac_of = {}
    if coll != "barrier":
        big = 1 << 40
        totals = buffer_totals(coll, w, int(big * _count_per_nbyte(coll, w)))
        frac_of = {b.name: totals[b.like or b.name] / big / sched.buffer(b.like or b.name).nchunks
                   for b in sched.buffers}
    phases = []
    for moves in sched.phases:
        agg = {}
        for m in moves:
            key = (m.rank, m.src_rank)
            f = frac_of.get(m.src.buf, 0.0)
            if key in agg:
                agg[key][0] += f
                agg[key][1] |= m.reduce
            else:
                agg[key] = [f, m.reduce]
        keys = list(agg)
        ph = FlowPhase([k[0] for k in keys], [k[1] for k in keys],
                       [agg[k][0] for k in keys], [agg[k][1] for k in keys])
        if phases and _same(phases[-1], ph):
            phases[-1].repeat += 1
        else:
            phases.append(ph)
    return phases


def _assert_equal(a, b, what):
    assert len(a) == len(b), what
    for i, (x, y) in enumerate(zip(a, b)):
        assert x.repeat == y.repeat, (what, i)
        for f in ("dst", "src", "frac", "reduce"):
            assert np.array_equal(getattr(x, f), getattr(y, f)), (what, i, f)


@pytest.mark.parametrize("w", WORLDS)
def test_flows_from_plans_equal_flows_from_moves(w):
    seen = 0
    for coll, algo, sched in _registered(w):
        fs = from_schedule(sched)
        _assert_equal(fs.phases, _flows_from_moves(sched), f"{coll}/{algo} W={w}")
        _assert_equal(from_registered(coll, algo, w).phases, fs.phases, f"{coll}/{algo}")
        seen += 1
    assert seen >= 13


@pytest.mark.parametrize("w", (2, 3, 4, 8))
def test_engine_waits_are_the_plans(w):
    """The synchronization rule the engines apply to the flows gives each plan's waits."""
    for coll, algo, sched in _registered(w):
        plans = model_plans(sched)
        phases = from_plans(plans).expanded()
        assert len(phases) == len(plans[0].phases), (coll, algo)
        prev = None
        for p, ph in enumerate(phases):
            waits = [set() for _ in range(w)]
            for s, d in zip(ph.src.tolist(), ph.dst.tolist()):
                if s != d:
                    waits[d].add(s)          # read after write
            if prev is not None:
                for s, d in zip(prev.src.tolist(), prev.dst.tolist()):
                    if s != d:
                        waits[s].add(d)      # write after read
            for r in range(w):
                assert tuple(sorted(waits[r])) == plans[r].phases[p].waits, (coll, algo, p, r)
            prev = ph
        ends = [set() for _ in range(w)]
        for s, d in zip(prev.src.tolist(), prev.dst.tolist()) if prev is not None else ():
            if s != d:
                ends[s].add(d)
        for r in range(w):
            assert tuple(sorted(ends[r])) == plans[r].end_waits, (coll, algo, r)


def test_times_unchanged_on_a_topology():
    t = build("dgx-h100", nodes=2, gpus=4)
    pr = t.spec.protocol("Simple")
    for coll, algo, sched in _registered(8):
        fs = from_schedule(sched)
        ref = from_schedule(sched)
        ref.phases = _flows_from_moves(sched)
        assert simulate_events(fs, t, pr, 1 << 24).time_us == \
            simulate_events(ref, t, pr, 1 << 24).time_us, (coll, algo)


def test_a_schedule_without_phases_costs_the_overhead_in_both_engines():
    from tilecomm.sim import predict, simulate_phases
    t = build("dgx-h100", nodes=1, gpus=8)
    pr = t.spec.protocol("Simple")
    fs = from_schedule(get_schedule("barrier", "direct", 8))
    assert not fs.phases
    assert simulate_events(fs, t, pr, 8).time_us == simulate_phases(fs, t, pr, 8).time_us > 0
    assert predict("barrier", 8, system="dgx-h100", gpus=8)[0].time_us > 0

"""The symbolic checker: every registered schedule passes for world sizes 1..16, and every
kind of defect it claims to catch is caught (so a passing check means something)."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tilecomm.algorithms import (COLLECTIVES, Loc, Move, ScheduleError, all_algorithms,
                                 check_schedule, get_schedule)
from tilecomm.algorithms.interpret import interpret

ALGOS = all_algorithms()


@pytest.mark.parametrize("collective,algo", ALGOS)
def test_registered_schedules_are_correct(collective, algo):
    for w in range(1, 17):
        roots = range(w) if COLLECTIVES[collective].rooted else [0]
        for root in roots:
            check_schedule(get_schedule(collective, algo, w, root))


def _replace_phase(sched, p, moves):
    phases = list(sched.phases)
    phases[p] = tuple(moves)
    return dataclasses.replace(sched, phases=tuple(phases))


schedules = st.sampled_from([a for a in ALGOS if a[0] != "barrier"]).flatmap(
    lambda ca: st.tuples(st.just(ca), st.integers(2, 16)).flatmap(
        lambda x: st.tuples(st.just(x[0]), st.just(x[1]),
                            st.integers(0, x[1] - 1) if COLLECTIVES[x[0][0]].rooted
                            else st.just(0))))


@settings(max_examples=200, deadline=None)
@given(schedules, st.data())
def test_dropping_any_transfer_is_caught(case, data):
    """Every remote move carries something nobody else delivers. (A local move may be
    redundant: one_shot's copy of its own staged input equals reducing into the input.)"""
    (collective, algo), w, root = case
    sched = get_schedule(collective, algo, w, root)
    remote = [(p, i) for p, ph in enumerate(sched.phases) for i, m in enumerate(ph)
              if not m.is_local]
    p, i = data.draw(st.sampled_from(remote))
    moves = list(sched.phases[p])
    del moves[i]
    with pytest.raises(ScheduleError):
        check_schedule(_replace_phase(sched, p, moves))


def _concrete_ok(sched) -> bool:
    """Run ``sched`` on random data and compare with the collective's definition."""
    w, n = sched.world_size, 3 * sched.world_size
    rng = np.random.default_rng(0)
    spec = COLLECTIVES[sched.collective]
    name = spec.inputs[0]
    total = {"buf": n, "in": n if sched.collective != "all_gather" else 3}[name]
    inputs = {name: [rng.random(total) for _ in range(w)]}
    state = interpret(sched, inputs, total)
    x = inputs[name]
    c = sched.collective
    if c == "all_reduce":
        return all(np.allclose(state["buf"][r], sum(x)) for r in range(w))
    if c == "broadcast":
        return all(np.array_equal(state["buf"][r], x[sched.root]) for r in range(w))
    if c == "reduce":
        return all(np.allclose(state["buf"][r], sum(x) if r == sched.root else x[r])
                   for r in range(w))
    if c == "all_gather":
        return all(np.array_equal(state["out"][r], np.concatenate(x)) for r in range(w))
    if c == "reduce_scatter":
        return all(np.allclose(state["out"][r], np.split(sum(x), w)[r]) for r in range(w))
    return all(np.array_equal(state["out"][r], np.concatenate([np.split(x[j], w)[r]
                                                                for j in range(w)]))
               for r in range(w))


@pytest.mark.parametrize("collective,algo", [a for a in ALGOS if a[0] not in
                                             ("barrier", "all_to_all_v")])
def test_interpreter_agrees_with_definition(collective, algo):
    for w in (1, 2, 3, 5, 8):
        assert _concrete_ok(get_schedule(collective, algo, w, w - 1))


@settings(max_examples=300, deadline=None)
@given(schedules, st.data())
def test_misdirected_move_is_caught_or_harmless(case, data):
    """Reading the wrong peer or chunk is flagged, unless the concrete result is still right
    (e.g. recursive doubling: several ranks hold the finished sum). The checker is sound."""
    (collective, algo), w, root = case
    sched = get_schedule(collective, algo, w, root)
    remote = [(p, i) for p, ph in enumerate(sched.phases) for i, m in enumerate(ph)
              if not m.is_local]
    if not remote:
        return
    p, i = data.draw(st.sampled_from(remote))
    m = sched.phases[p][i]
    nchunks = sched.buffer(m.src.buf).nchunks
    if data.draw(st.booleans()) or nchunks == 1:
        others = [r for r in range(w) if r not in (m.src_rank, m.rank)]
        if not others:
            return
        bad = dataclasses.replace(m, src_rank=data.draw(st.sampled_from(others)))
    else:
        c = data.draw(st.sampled_from([c for c in range(nchunks) if c != m.src.chunk]))
        bad = dataclasses.replace(m, src=Loc(m.src.buf, c))
    moves = list(sched.phases[p])
    moves[i] = bad
    mutated = _replace_phase(sched, p, moves)
    try:
        check_schedule(mutated)
    except ScheduleError:
        return
    assert collective != "all_to_all_v" and _concrete_ok(mutated), \
        f"checker passed a wrong schedule: {bad} in phase {p}"


def test_race_within_a_phase_is_caught():
    # Merge the reduce-scatter and all-gather of two_shot into one phase: rank r would copy a
    # chunk its owner is still reducing.
    s = get_schedule("all_reduce", "two_shot", 3)
    merged = dataclasses.replace(s, phases=(s.phases[0] + s.phases[1],))
    with pytest.raises(ScheduleError, match="same phase"):
        check_schedule(merged)


def test_double_count_is_caught():
    s = get_schedule("all_reduce", "one_shot", 2)
    dup = s.phases[1] + (Move(0, Loc("buf", 0), 1, Loc("tmp", 0), reduce=True),)
    with pytest.raises(ScheduleError, match="twice"):
        check_schedule(_replace_phase(s, 1, dup))


def test_sync_rule_derivation():
    ring = get_schedule("all_reduce", "ring", 4)
    # rank 2 reads rank 1 and is read by rank 3 in every step
    assert ring.waits_before(2, 0) == {1}
    assert ring.waits_before(2, 1) == {1, 3}
    assert ring.waits_at_end(2) == {3}
    one = get_schedule("all_reduce", "one_shot", 4)
    assert one.leading_local_phases == 1 and one.waits_before(0, 1) == {1, 2, 3}

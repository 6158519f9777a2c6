"""The CPU executor's placement policy (tilecomm.algorithms.placement, NOTE [placement]): one
function the executor and the CPU cost model both call, checked case by case here; the
executor's single-copy tests and the cost model's tests run it in place."""

from tilecomm.algorithms.placement import CMA, HEAP, LOCAL, SCRATCH, cpu_plan, place, single_copy


def test_a_callers_buffer_lives_where_the_caller_put_it_unless_peers_must_read_it():
    ar = cpu_plan("all_reduce", "ring", 2, 0, 0)              # peers reduce "buf": staged
    assert place(ar, "buf", in_heap=True, single_copy=False) == HEAP
    assert place(ar, "buf", in_heap=False, single_copy=False) == SCRATCH
    assert "buf" in ar.peer_reduced                           # a reduction operand is staged
    assert place(ar, "buf", in_heap=False, single_copy=True) == SCRATCH
    ag = cpu_plan("all_gather", "direct", 2, 0, 0)            # peers copy "in": read in place
    assert "in" in ag.symmetric and "in" not in ag.peer_reduced
    assert place(ag, "in", in_heap=False, single_copy=True) == CMA
    assert place(ag, "in", in_heap=False, single_copy=True, present=False) == SCRATCH
    assert "out" not in ag.symmetric                          # no peer reads this rank's out
    assert place(ag, "out", in_heap=False, single_copy=False) == LOCAL


def test_scratch_is_scratch_unless_it_aliases_a_callers_buffer():
    seen = set()
    for coll, algo in (("all_reduce", "two_shot"), ("reduce_scatter", "ring"),
                       ("reduce", "tree")):
        plan = cpu_plan(coll, algo, 3, 0, 1)
        for b in plan.names:
            if b in ("buf", "in", "out"):
                continue
            spec = plan.sched.buffer(b)
            seen.add(spec.alias)
            heap = place(plan, b, in_heap=True, single_copy=False)
            assert heap == (HEAP if spec.alias else SCRATCH), (coll, algo, b)
            assert place(plan, b, in_heap=False, single_copy=False) == SCRATCH
            assert place(plan, b, in_heap=True, single_copy=False, present=False) == SCRATCH
    assert seen == {True, False}                # both kinds of scratch were placed


def test_single_copy_needs_every_rank_and_a_large_enough_call():
    assert single_copy(1 << 20, enabled=True, min_bytes=16 << 10)
    assert not single_copy(1 << 10, enabled=True, min_bytes=16 << 10)
    assert not single_copy(1 << 20, enabled=False, min_bytes=16 << 10)


def test_the_executors_plan_adds_its_fields_to_the_common_plan():
    from tilecomm.algorithms.lower import lower
    common = lower("all_reduce", "one_shot", 4, 0, 2)
    cpu = cpu_plan("all_reduce", "one_shot", 4, 0, 2)
    assert cpu.phases == common.phases and cpu.names == common.names
    assert not hasattr(common, "slot_base") and cpu.nslots == sum(
        cpu.sched.buffer(b).nchunks for b in cpu.symmetric)

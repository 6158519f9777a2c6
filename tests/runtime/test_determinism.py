"""Deterministic mode and the reduction order, on random float data (integers hide rounding).

NOTE [reduction order] (``algorithms/lower.py``): every reduction combines its operands in the
order the schedule lists them, accumulating fp16/bf16 in float32 and rounding once. one_shot,
two_shot, direct reduce_scatter and direct reduce list every rank in order 0..W-1, so they
return the bits of ``reference.rank_order_reduced`` at every size (pieces included: the test
scratch is 64 KiB); with ``deterministic=True`` ``auto`` picks only such algorithms and the
others are refused with an error that names the ones that can.
"""

from __future__ import annotations

import pytest
import torch

from tilecomm import reference
from tilecomm.algorithms import COLLECTIVES, algorithms
from tilecomm.algorithms.lower import deterministic_algorithms, rank_ordered

FLOATS = [torch.float32, torch.bfloat16, torch.float16]
SIZES = [1, 5, 1023, 70_001]      # 70_001 run in pieces of the test scratch; auto: two_shot
OPS = ["sum", "avg", "prod"]


def _data(seed: int, rank: int, n: int, dtype, op: str) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed * 7919 + rank)
    x = torch.randn(n, generator=g, dtype=torch.float64)
    if op == "prod":                       # near 1, so products neither vanish nor overflow
        x = 1 + x / 8
    else:                                  # mixed magnitudes make the order matter
        x = x * torch.exp2(torch.randint(-6, 7, (n,), generator=g)).double()
    return x.to(dtype)


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.view({2: torch.int16, 4: torch.int32, 8: torch.int64}[t.element_size()])


def _check_all(comm, cases, deterministic):
    """Every case's result vs the rank-order reference, computed on this rank from every rank's
    (seeded) data; returns the list of mismatching cases."""
    comm.deterministic = deterministic
    w, bad = comm.world_size, []
    for seed, (coll, algo, n, dtype, op, root) in enumerate(cases):
        xs = [_data(seed, r, n, dtype, op) for r in range(w)]
        x = xs[comm.rank].clone()
        ref = reference.rank_order_reduced(xs, op)
        if coll == "all_reduce":
            comm.all_reduce(x, op, algo=algo)
            got, want = x, ref
        elif coll == "reduce":
            comm.reduce(x, root, op, algo=algo)
            if comm.rank != root:
                continue
            got, want = x, ref
        else:
            got = comm.reduce_scatter(x, op, algo=algo)
            m = n // w
            want = ref[comm.rank * m:(comm.rank + 1) * m]
        if not torch.equal(_bits(got), _bits(want)):
            diff = int((_bits(got) != _bits(want)).sum())
            bad.append((coll, algo, n, str(dtype), op, root, diff))
    return bad


def _cases(w, algos_of, sizes=SIZES):
    out = []
    for coll in ("all_reduce", "reduce_scatter", "reduce"):
        for algo in algos_of(coll):
            for n in sizes:
                n = n * w if coll == "reduce_scatter" else n
                for dtype in FLOATS:
                    for op in OPS:
                        if op == "prod" and n > 2000:
                            continue
                        out.append((coll, algo, n, dtype, op, (w - 1) if coll == "reduce" else 0))
    return out


@pytest.mark.parametrize("world_size", [2, 3, 4])
def test_deterministic_mode_gives_rank_order_bits(rank_pool, world_size):
    cases = _cases(world_size, lambda c: ["auto"] + deterministic_algorithms(c, world_size,
                                                                             world_size - 1))
    bad = rank_pool(world_size).run(_check_all, cases, True)
    assert bad == [[]] * world_size


@pytest.mark.parametrize("world_size", [3, 4])
def test_default_mode_rank_ordered_algorithms_give_rank_order_bits(rank_pool, world_size):
    """The default mode runs the same plans: the rank-ordered algorithms (what auto picks on
    up to 8 ranks) give the reference's bits there too, which the GPU kernels must match."""
    cases = _cases(world_size, lambda c: deterministic_algorithms(c, world_size,
                                                                  world_size - 1), [5, 40_001])
    bad = rank_pool(world_size).run(_check_all, cases, False)
    assert bad == [[]] * world_size


def test_ring_is_not_rank_order_and_the_check_sees_it(rank_pool):
    """The check is not vacuous: ring all_reduce on random floats differs from the reference
    (it sums each chunk starting at another rank), which is why deterministic mode refuses it."""
    bad = rank_pool(3).run(_check_all, [("all_reduce", "ring", 999, torch.float32, "sum", 0),
                                    ("all_reduce", "ring", 999, torch.bfloat16, "sum", 0)], False)
    assert all(len(b) == 2 for b in bad)


def _refused(comm, coll, algo):
    comm.deterministic = True
    x = torch.ones(8 * comm.world_size)
    try:
        if coll == "all_reduce":
            comm.all_reduce(x, algo=algo)
        elif coll == "reduce":
            comm.reduce(x, 1, algo=algo)
        else:
            comm.reduce_scatter(x, algo=algo)
    except ValueError as e:
        return str(e)
    finally:
        comm.deterministic = False
    return None


@pytest.mark.parametrize("coll,algo,named", [("all_reduce", "ring", "one_shot, two_shot"),
                                             ("all_reduce", "recursive_doubling", "one_shot"),
                                             ("all_reduce", "rhd", "one_shot, two_shot"),
                                             ("reduce_scatter", "ring", "direct"),
                                             ("reduce", "tree", "direct")])
def test_deterministic_mode_refuses_other_algorithms_on_every_rank(rank_pool, coll, algo, named):
    msgs = rank_pool(3).run(_refused, coll, algo)
    for m in msgs:
        assert m is not None and f"{algo!r}" in m and named in m and "deterministic" in m


def test_rank_ordered_classification():
    """Derived from the schedules, not declared: the single-reduction algorithms qualify for
    every world size and root, the multi-step ones do not (beyond trivial sizes)."""
    for w in range(1, 17):
        for root in range(w):
            assert rank_ordered("reduce", "direct", w, root)
        assert rank_ordered("all_reduce", "one_shot", w)
        assert rank_ordered("all_reduce", "two_shot", w)
        assert rank_ordered("reduce_scatter", "direct", w)
    for w in range(2, 17):
        # rhd: each chunk is summed by one rank, but in halving order ((x0 + x2) + (x1 + x3)
        # on 4 ranks) and, at 2 ranks, rank 1 adds rank 0's value to its own
        assert not rank_ordered("all_reduce", "rhd", w)
    for w in range(3, 17):
        assert not rank_ordered("all_reduce", "ring", w)
        assert not rank_ordered("all_reduce", "recursive_doubling", w)
        assert not rank_ordered("reduce_scatter", "ring", w)
        assert not rank_ordered("reduce", "tree", w, 0)
    assert not rank_ordered("reduce", "tree", 2, 1)    # the root adds rank 0 after itself
    for coll in COLLECTIVES:
        if not COLLECTIVES[coll].reduces and coll != "barrier":
            assert all(rank_ordered(coll, a, 4) for a in algorithms(coll))


def test_auto_picks_direct_reduce_beyond_eight_ranks_in_deterministic_mode():
    from tilecomm import tuner

    ok = deterministic_algorithms("reduce", 12, 0)
    assert "tree" not in ok
    assert tuner.choose("reduce", 1 << 20, 12, available=ok) == "direct"


def test_launch_passes_deterministic_to_every_rank():
    import tilecomm

    def modes(comm):
        return comm.deterministic, _refused(comm, "all_reduce", "ring") is not None

    assert tilecomm.launch(lambda c: c.deterministic, 2, deterministic=True) == [True, True]
    assert tilecomm.launch(lambda c: c.deterministic, 2) == [False, False]
    assert tilecomm.launch(modes, 2, deterministic=True) == [(True, True)] * 2

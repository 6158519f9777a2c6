"""Conformance: the hand-fused kernels give the generic plan kernel's and the CPU executor's
exact bits.

On random float32, bfloat16 and float16 data (not integer-valued: rounding and summation order
show), at 2, 3 and 4 ranks and several sizes (odd ones included), every fused kernel that has a
schedule of the same name runs the same call three ways on each rank: the fused kernel
(``registry.FUSED = True``), the plan kernel (``registry.FUSED = False``) and the CPU schedule
executor (``comm.use_cpu_kernels("executor")``). The CPU executor defines the bits (NOTE
[reduction order], ``algorithms/lower.py``: operands in the schedule's order, fp32 accumulation
for 16-bit inputs, ``avg`` divided before the one rounding); the three results are compared as
bit patterns (``view(int16 / int32)``), not values.

NOTE [interpreter bf16 rounding] (``tilecomm.device.interpreter``): the Triton interpreter
truncates float32 -> bfloat16 where a GPU rounds to nearest even; the Triton backend patches
that one conversion in interpreted ranks, so the comparison here is the one a GPU makes.
"""

from __future__ import annotations

import pytest
import torch

import test_plan_kernel as tpk

pytestmark = pytest.mark.interpreter

#: (collective, algo) of the fused kernels checked here
PAIRS = [("all_reduce", "one_shot"), ("all_reduce", "two_shot"),
         ("reduce_scatter", "direct"), ("all_gather", "direct"),
         ("broadcast", "direct"), ("all_to_all", "pairwise"),
         ("reduce_scatter", "ring"), ("all_gather", "ring")]

DTYPES = (torch.float32, torch.bfloat16, torch.float16)
SIZES = (131, 3, 517, 1000, 1, 258)
_BITS = {torch.float32: torch.int32, torch.bfloat16: torch.int16, torch.float16: torch.int16}


def cases(coll, w):
    """(dtype, op, n, root) for one kernel at ``w`` ranks: every dtype with sum and avg for
    the reducing ones (prod in fp32 and bf16 too), sizes rotating through SIZES."""
    out = []
    if coll in ("all_reduce", "reduce_scatter"):
        combos = [(dt, op) for dt in DTYPES for op in ("sum", "avg")]
        combos += [(torch.float32, "prod"), (torch.bfloat16, "prod")]
    else:
        combos = [(dt, "sum") for dt in DTYPES]
    for i, (dt, op) in enumerate(combos):
        n = SIZES[(i + w) % len(SIZES)]
        if coll in ("reduce_scatter", "all_to_all", "all_gather"):
            n = max(1, n // w)              # per-rank block: the calls move w * n elements
        root = (i + 1) % w if coll == "broadcast" else 0
        out.append((dt, op, n, root))
    return out


def random_input(coll, w, r, n, k, dtype, op):
    g = torch.Generator().manual_seed(1000 * k + 17 * r + w)
    x = torch.randn(tpk.in_len(coll, w, n), generator=g)
    if op == "prod":
        x = 1 + x / 8                       # products of w factors near 1: no overflow
    return x.to(dtype)


def gpu_bf16_rounding(comm=None):
    """The backend installs it in interpreted ranks; called here too in case a case runs
    before any backend exists (NOTE [interpreter bf16 rounding], tilecomm.device.interpreter)."""
    from tilecomm.device.interpreter import round_bf16_like_gpu

    assert round_bf16_like_gpu()


def bits(t):
    return t.contiguous().view(_BITS[t.dtype])


def compare(comm, coll, algo):
    """Every case of ``coll/algo``: ``(tag, fused == plan, fused == executor, plan ==
    executor, elements differing fused vs executor, first such index)`` per case."""
    from tilecomm.backends.triton import registry
    from tilecomm.backends.triton.kernels.plan import launch_plan

    w, r = comm.world_size, comm.rank
    red = coll in tpk.REDUCING
    out = []
    gpu_bf16_rounding()
    try:
        for k, (dt, op, n, root) in enumerate(cases(coll, w)):
            x = random_input(coll, w, r, n, k, dt, op)
            tpk.set_fused(comm, True)
            spec = registry.lookup(coll, algo, dt, op if red else None)
            assert spec.launch is not launch_plan, f"{coll}/{algo} {dt} {op}: no fused kernel"
            fused = bits(tpk.run_one(comm, coll, algo, x, op, root))
            tpk.set_fused(comm, False)
            assert tpk.uses_plan(coll, algo, dt, op if red else None)
            plan = bits(tpk.run_one(comm, coll, algo, x, op, root))
            ref = bits(tpk.executor(comm, tpk.run_one, comm, coll, algo, x, op, root))
            diff = (fused != ref).nonzero().reshape(-1)
            out.append((f"{coll}/{algo} w={w} {str(dt)[6:]} {op} n={n} root={root}",
                        torch.equal(fused, plan), torch.equal(fused, ref),
                        torch.equal(plan, ref), diff.numel(),
                        int(diff[0]) if diff.numel() else -1))
    finally:
        tpk.set_fused(comm, None)
    return out


@pytest.mark.slow
@pytest.mark.parametrize("w", [2, 3, 4])
@pytest.mark.parametrize("coll,algo", PAIRS, ids=[f"{c}-{a}" for c, a in PAIRS])
def test_fused_plan_and_executor_bits_agree(coll, algo, w, rank_pool):
    res = rank_pool(w, "kernels").run(compare, coll, algo)
    bad = []
    for r, rows in enumerate(res):
        for tag, fp, fe, pe, ndiff, first in rows:
            if not (fp and fe and pe):
                bad.append(f"rank {r} {tag}: fused==plan {fp}, fused==executor {fe}, "
                           f"plan==executor {pe} ({ndiff} elements differ, first {first})")
    assert not bad, "\n".join(bad)


def _deterministic_on_kernels(comm):
    """Deterministic mode on the kernel backend: random data, every size class, auto and the
    explicit rank-order algorithms, bits of reference.rank_order_reduced (the backend rounds
    bf16 like a GPU in the interpreter: NOTE [interpreter bf16 rounding])."""
    from tilecomm import reference

    comm.use_cpu_kernels("triton")
    comm.deterministic = True
    bad = []
    try:
        for k, (algo, dt, op, n) in enumerate(
                [(a, dt, op, n) for a in ("auto", "one_shot", "two_shot")
                 for dt in DTYPES for op in ("sum", "avg") for n in (131, 1000)]):
            g = [torch.Generator().manual_seed(1000 * k + r) for r in range(comm.world_size)]
            xs = [(torch.randn(n, generator=g[r]) * 64).to(dt) for r in range(comm.world_size)]
            x = xs[comm.rank].clone()
            comm.all_reduce(x, op, algo=algo)
            if not torch.equal(bits(x), bits(reference.rank_order_reduced(xs, op))):
                bad.append((algo, str(dt), op, n))
        xs = [(torch.randn(77, generator=torch.Generator().manual_seed(7 + r)) * 64)
              .to(torch.bfloat16) for r in range(comm.world_size)]
        x = xs[comm.rank].clone()
        comm.reduce(x, comm.world_size - 1, "sum")          # the plan kernel (direct reduce)
        if comm.rank == comm.world_size - 1 and \
                not torch.equal(bits(x), bits(reference.rank_order_reduced(xs))):
            bad.append("reduce")
        comm.synchronize()
    finally:
        comm.deterministic = False
        comm.use_cpu_kernels("executor")
    return bad


@pytest.mark.slow
def test_deterministic_mode_on_the_kernels_gives_rank_order_bits(rank_pool):
    res = rank_pool(3, "kernels").run(_deterministic_on_kernels)
    assert res == [[]] * 3, res

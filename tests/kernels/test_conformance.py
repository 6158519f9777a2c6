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

NOTE [interpreter bf16 rounding]
    The Triton interpreter (3.9) converts float32 to bfloat16 by *truncation*
    (``InterpreterBuilder.cast_impl`` calls ``_convert_float`` with no rounding mode), while a
    GPU rounds to nearest even (``cvt.rn.bf16.f32``) as torch does. Unpatched, every Triton
    kernel's bf16 reductions differ from the executor in the last bit (fused and plan kernels
    agree with each other). The rank processes here patch that one conversion to round to
    nearest even (:func:`gpu_bf16_rounding`), so the comparison is the one a GPU makes.
"""

from __future__ import annotations

import pytest
import torch

import test_plan_kernel as tpk

#: (collective, algo) of the fused kernels checked here
PAIRS = [("all_reduce", "one_shot"), ("all_reduce", "two_shot"),
         ("reduce_scatter", "direct"), ("all_gather", "direct"),
         ("broadcast", "direct"), ("all_to_all", "pairwise")]

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
    """Make the interpreter round float32 -> bfloat16 to nearest even, as GPUs and torch do
    (NOTE [interpreter bf16 rounding]). Idempotent; rank side."""
    import numpy as np
    import triton.language as tl
    from triton.runtime import interpreter as itp

    if getattr(itp.InterpreterBuilder, "_tilecomm_rne", False):
        return
    orig = itp.InterpreterBuilder.cast_impl

    def cast_impl(self, src, dst_type):
        if src.dtype.scalar == tl.float32 and dst_type.scalar == tl.bfloat16:
            a = np.ascontiguousarray(src.data, dtype=np.float32)
            out = torch.from_numpy(a.reshape(-1)).to(torch.bfloat16).view(torch.int16)
            return itp.TensorHandle(out.numpy().view(np.uint16).reshape(a.shape),
                                    dst_type.scalar)
        return orig(self, src, dst_type)

    itp.InterpreterBuilder.cast_impl = cast_impl
    itp.InterpreterBuilder._tilecomm_rne = True


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


@pytest.fixture(scope="module", autouse=True)
def _stop_pools():
    yield
    for g in tpk._POOLS.values():
        g.stop()
    tpk._POOLS.clear()


@pytest.mark.parametrize("w", [2, 3, 4])
@pytest.mark.parametrize("coll,algo", PAIRS, ids=[f"{c}-{a}" for c, a in PAIRS])
def test_fused_plan_and_executor_bits_agree(coll, algo, w):
    res = tpk._run(w, compare, coll, algo)
    bad = []
    for r, rows in enumerate(res):
        for tag, fp, fe, pe, ndiff, first in rows:
            if not (fp and fe and pe):
                bad.append(f"rank {r} {tag}: fused==plan {fp}, fused==executor {fe}, "
                           f"plan==executor {pe} ({ndiff} elements differ, first {first})")
    assert not bad, "\n".join(bad)

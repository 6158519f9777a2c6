"""The Triton kernels of the fused ops (tilecomm.backends.triton.kernels.overlap_gemm) in the
Triton interpreter on CPU tensors (``comm.use_cpu_kernels("triton")``), and compiled for sm_90.

What is exact and what is not: the kernels' float32 GEMM tiles (``tl.dot``) add the K products
in another order than torch's BLAS, so their results are compared with the references with a
tolerance; the rank-order reduction of matmul_reduce_scatter is compared bit for bit on data
whose partial products are exact in any GEMM (cases.order_sensitive_rs)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch

import cases

pytestmark = pytest.mark.interpreter

HERE = os.path.dirname(os.path.abspath(__file__))
TOL = {torch.float32: 1e-4, torch.bfloat16: 0.1, torch.float16: 1e-2}


def _many(comm, dtype):
    w = comm.world_size
    ag = [cases.run_ag(comm, 21, 40, 37, dtype, seed=s) for s in range(2)]     # halves 0, 1
    ag.append(cases.run_ag(comm, 33, 19, 70, dtype, seed=3, gathered=True,     # grows
                           b_transposed=True))
    ag.append(cases.run_ag(comm, 5, 8, 9, dtype, seed=4, out=True))
    rs = [cases.run_rs(comm, 17, [40] * w, 37, dtype, seed=s) for s in range(2)]
    rs.append(cases.run_rs(comm, 18, [9 + 11 * s for s in range(w)], 50, dtype, seed=5,
                           out=True))
    return ag, rs


@pytest.mark.parametrize("w,dtype", [(2, torch.float32), (3, torch.float32),
                                     (2, torch.bfloat16), (3, torch.float16)], ids=str)
@pytest.mark.slow
def test_kernels_match_the_references(rank_pool, w, dtype):
    for ag, rs in rank_pool(w, "kernels").run(_many, dtype):
        assert all(d <= TOL[dtype] for _, d, _ in ag), ag
        assert [g for _, _, g in ag if g is not None] == [True]     # the gathered A: exact
        assert all(d <= TOL[dtype] for _, d in rs), rs


def _stream_many(comm, dtype):
    """copy="stream" (wait kernel, copy, per-chunk GEMM), interleaved with the persistent
    kernel's calls (they share the pad slots and epochs), both halves, growth, out=."""
    res = [cases.run_ag(comm, 21, 40, 37, dtype, seed=0, copy="stream"),
           cases.run_ag(comm, 21, 40, 37, dtype, seed=1),
           cases.run_ag(comm, 21, 40, 37, dtype, seed=2, copy="stream"),
           cases.run_ag(comm, 33, 19, 70, dtype, seed=3, gathered=True, b_transposed=True,
                        copy="stream"),
           cases.run_ag(comm, 5, 8, 9, dtype, seed=4, out=True, copy="stream"),
           cases.run_ag(comm, 0, 8, 9, dtype, seed=5, copy="stream")]
    return res


@pytest.mark.parametrize("w,dtype", [(2, torch.float32), (3, torch.bfloat16)], ids=str)
def test_copy_engine_variant_matches_the_references(rank_pool, w, dtype):
    for res in rank_pool(w, "kernels").run(_stream_many, dtype):
        assert all(d <= TOL[dtype] for _, d, _ in res), res
        assert [g for _, _, g in res if g is not None] == [True]


def test_kernel_reduction_is_in_rank_order(rank_pool):
    for same, reorder_changes in rank_pool(3, "kernels").run(cases.order_sensitive_rs, 19, 40):
        assert same
        assert reorder_changes > 0


@pytest.mark.parametrize("case", ["K", "dtype", "rows", "copy"])
def test_kernel_path_errors_on_every_rank(rank_pool, case):
    for got, after in rank_pool(2, "kernels").run(cases.bad_call, case):
        assert got is not None and got[0] in ("ValueError", "CommMismatch"), got
        assert after <= 1e-4


@pytest.mark.slow
@pytest.mark.compile
def test_kernels_compile_for_sm90_with_tensor_cores_and_acquire_waits():
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    r = subprocess.run([sys.executable, os.path.join(HERE, "overlap_ptx.py")], env=env,
                       capture_output=True, text=True, timeout=600)
    if r.returncode == 3:
        pytest.skip(r.stderr.strip())
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    res = json.loads([x for x in r.stdout.splitlines() if x.startswith("RESULT ")][-1][7:])
    ag, rs = res["all_gather_matmul_kernel"], res["matmul_reduce_scatter_kernel"]
    for k in (ag, rs):
        assert k["ordering"] == [], k       # releases after bar.sync, acquires before it
        assert k["mma"] > 0, k              # bf16 tiles on Hopper tensor cores (wgmma)
    # all_gather_matmul: the chunk wait and the row-block wait, each an acquire (first look
    # and poll loop); the ready signals to 8 peers (unrolled) and the row-block signal
    assert ag["acquire_fences"] >= 2 and ag["release_atomics"] >= 2, ag
    # matmul_reduce_scatter: one wait per peer of each tile (WORLD=8 unrolled), one signal
    assert rs["acquire_fences"] >= 7 and rs["release_atomics"] >= 1, rs

"""The CPU (shared-memory) engine of all_gather_matmul / matmul_reduce_scatter: the exact bits
of the rank-order references (tilecomm.ops.reference) for every dtype, repeated calls (the two
workspace halves), growth of the workspace, return_gathered, out=, uneven K slices, strided b;
errors on every rank; autograd against single-process autograd."""

from __future__ import annotations

import pytest
import torch

import cases

DTYPES = (torch.float32, torch.bfloat16, torch.float16)


def _ag_many(comm, dtype):
    out = [cases.run_ag(comm, 5, 7, 6, dtype, seed=s) for s in range(3)]       # halves 0,1,0
    out.append(cases.run_ag(comm, 9, 33, 17, dtype, seed=5, gathered=True))    # grows
    out.append(cases.run_ag(comm, 9, 33, 17, dtype, seed=6, out=True, b_transposed=True))
    out.append(cases.run_ag(comm, 0, 4, 3, dtype))                             # empty
    out.append(cases.run_ag(comm, 5, 7, 6, dtype, seed=9, copy="stream"))      # same code
    return out


def _rs_many(comm, dtype):
    w = comm.world_size
    out = [cases.run_rs(comm, 4, [6] * w, 5, dtype, seed=s) for s in range(3)]
    out.append(cases.run_rs(comm, 7, [3 + 5 * s for s in range(w)], 19, dtype, seed=4))
    out.append(cases.run_rs(comm, 7, [9] * w, 19, dtype, seed=8, out=True))
    # 33 x 70 = 2310 elements per partial: torch's vectorized add and its scalar tail both
    # run (the sum of the partials is a single add of two 16-bit tensors at W=2: ops/cpu.py)
    out.append(cases.run_rs(comm, 33, [40] * w, 70, dtype, seed=11))
    return out


@pytest.mark.parametrize("w", [2, 3])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_cpu_engine_gives_the_reference_bits(rank_pool, w, dtype):
    for rank_res in rank_pool(w).run(_ag_many, dtype):
        assert all(eq for eq, _, _ in rank_res), rank_res
        assert [g for _, _, g in rank_res if g is not None] == [True]
    for rank_res in rank_pool(w).run(_rs_many, dtype):
        assert all(eq for eq, _ in rank_res), rank_res


def test_reduction_is_in_rank_order(rank_pool):
    for same, reorder_changes in rank_pool(3).run(cases.order_sensitive_rs, 4, 6):
        assert same
        assert reorder_changes > 0     # the data can tell the order apart


@pytest.mark.parametrize("case,rank1,others", [
    ("K", ("ValueError", "inner dimension K"), ("ValueError", "rank 1 rejected")),
    ("m", ("CommMismatch", "m (rows of a_shard)"), ("CommMismatch", "m (rows of a_shard)")),
    ("dtype", ("CommMismatch", "dtype"), ("CommMismatch", "rank 1: bfloat16")),
    ("float64", ("TypeError", "float64"), ("TypeError", "float64")),
    ("rows", ("ValueError", "M=13"), ("ValueError", "multiple of world_size")),
    ("N", ("CommMismatch", "disagree on N"), ("CommMismatch", "rank 2: 8")),
    ("out", ("ValueError", "out has the wrong shape"), ("ValueError", "rank 1 rejected")),
    ("not_tensor", ("TypeError", "a is not a torch.Tensor"), ("TypeError", "rank 1")),
    ("gathered", ("CommMismatch", "return_gathered"), ("CommMismatch", "return_gathered")),
    ("copy", ("CommMismatch", "rank 1: stream"), ("CommMismatch", "disagree on copy")),
    ("copy_value", ("ValueError", "'dma'"), ("ValueError", "rank 1 rejected")),
])
def test_bad_calls_raise_on_every_rank(rank_pool, case, rank1, others):
    res = rank_pool(3).run(cases.bad_call, case)
    for r, (got, after) in enumerate(res):
        want = rank1 if r == 1 else others
        assert got is not None and got[0] == want[0] and want[1] in got[1], (r, got)
        assert after == 0.0                        # the next call works


def _tp_grads(comm):
    """Column-parallel all_gather_matmul, relu, row-parallel matmul_reduce_scatter, backward of
    the loss sum over ranks of their rows' squares; against the same loss in one process."""
    from tilecomm.ops import all_gather_matmul, matmul_reduce_scatter

    w, r = comm.world_size, comm.rank
    m, d, h = 3, 8, 12
    x_full = cases.rand((w * m, d), 1, torch.float32)
    w1 = cases.rand((d, h), 2, torch.float32)
    w2 = cases.rand((h, d), 3, torch.float32)
    cols = slice(r * h // w, (r + 1) * h // w)
    rows = slice(r * m, (r + 1) * m)
    x = x_full[rows].clone().requires_grad_()
    w1r, w2r = w1[:, cols].clone().requires_grad_(), w2[cols].clone().requires_grad_()
    y = matmul_reduce_scatter(torch.relu(all_gather_matmul(x, w1r, comm)), w2r, comm)
    (y * y).sum().backward()          # every rank: the backward collectives add the terms up
    xf, w1f, w2f = (t.clone().requires_grad_() for t in (x_full, w1, w2))
    yf = torch.relu(xf @ w1f) @ w2f
    (yf * yf).sum().backward()
    return [cases.maxdiff(y, yf[rows]), cases.maxdiff(x.grad, xf.grad[rows]),
            cases.maxdiff(w1r.grad, w1f.grad[:, cols]), cases.maxdiff(w2r.grad, w2f.grad[cols])]


@pytest.mark.parametrize("w", [2, 3])
def test_autograd_matches_single_process(rank_pool, w):
    for diffs in rank_pool(w).run(_tp_grads):
        assert max(diffs) < 1e-4, diffs

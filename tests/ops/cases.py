"""Rank-side cases shared by the fused-op tests: every rank builds every rank's inputs from
seeds, so each rank can compute the references (on its own process and thread count, as the
CPU engine's bit-exactness needs) and compare its own result."""

from __future__ import annotations

import gc

import torch

from tilecomm.ops import (all_gather_matmul, all_gather_matmul_reference,
                          matmul_reduce_scatter, matmul_reduce_scatter_reference)


def rand(shape, seed, dtype):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)).to(dtype)


def ag_inputs(w, m, k, n, dtype, seed=0, b_transposed=False):
    shards = [rand((m, k), seed + 10 * s, dtype) for s in range(w)]
    b = rand((n, k), seed + 7, dtype).t() if b_transposed else rand((k, n), seed + 7, dtype)
    return shards, b


def rs_inputs(w, m, ks, n, dtype, seed=0):
    a = [rand((w * m, ks[s]), seed + 10 * s, dtype) for s in range(w)]
    b = [rand((ks[s], n), seed + 10 * s + 5, dtype) for s in range(w)]
    return a, b


def maxdiff(x, y):
    return (x.float() - y.float()).abs().max().item() if x.numel() else 0.0


def run_ag(comm, m, k, n, dtype, seed=0, gathered=False, out=False, b_transposed=False,
           copy="kernel"):
    """(bits equal to the reference, max abs difference, gathered A equal) for this rank."""
    try:
        shards, b = ag_inputs(comm.world_size, m, k, n, dtype, seed, b_transposed)
        ref, gref = all_gather_matmul_reference(shards, b)
        o = torch.full((comm.world_size * m, n), float("nan"), dtype=dtype) if out else None
        res = all_gather_matmul(shards[comm.rank], b, comm, return_gathered=gathered, out=o,
                                copy=copy)
        c, g = res if gathered else (res, None)
        if out:
            assert c is o
        return (bool(torch.equal(c, ref)), maxdiff(c, ref),
                None if g is None else bool(torch.equal(g, gref)))
    finally:
        gc.collect()


def run_rs(comm, m, ks, n, dtype, seed=0, out=False):
    """(bits equal to the reference, max abs difference) for this rank."""
    try:
        a, b = rs_inputs(comm.world_size, m, ks, n, dtype, seed)
        ref = matmul_reduce_scatter_reference(a, b)[comm.rank]
        o = torch.full((m, n), float("nan"), dtype=dtype) if out else None
        y = matmul_reduce_scatter(a[comm.rank], b[comm.rank], comm, out=o)
        if out:
            assert y is o
        return bool(torch.equal(y, ref)), maxdiff(y, ref)
    finally:
        gc.collect()


def order_sensitive_rs(comm, m, n, k=8):
    """Data whose partial products are exact in float32 in any GEMM (small integers), scaled
    per rank so that adding them in another order rounds differently. Returns (bits equal to
    the rank-order reference, how many elements a reversed-order sum would change)."""
    w = comm.world_size
    scales = [2.0 ** 22, 2.0 ** -3, -(2.0 ** 21), 2.0 ** -7, 2.0 ** 9][:w]   # exact partials
    a, b = [], []
    for s in range(w):
        g = torch.Generator().manual_seed(40 + s)
        a.append(torch.randint(-3, 4, (w * m, k), generator=g).float())
        b.append(torch.randint(-3, 4, (k, n), generator=g).float() * scales[s])
    ref = matmul_reduce_scatter_reference(a, b)[comm.rank]
    rows = slice(comm.rank * m, (comm.rank + 1) * m)
    parts = [a[s][rows] @ b[s] for s in range(w)]
    rev = parts[-1].clone()
    for p in reversed(parts[:-1]):
        rev += p
    y = matmul_reduce_scatter(a[comm.rank], b[comm.rank], comm)
    gc.collect()
    return bool(torch.equal(y, ref)), int((rev != ref).sum())


def catch(fn):
    try:
        fn()
    except Exception as e:  # noqa: BLE001 - the test inspects it
        return type(e).__name__, str(e)
    finally:
        gc.collect()
    return None


def bad_call(comm, case):
    """One rank (1) or every rank passes something wrong; returns (type, message) per rank."""
    r, w = comm.rank, comm.world_size
    x = rand((4, 8), r, torch.float32)
    b = rand((8, 6), 9, torch.float32)
    calls = {
        "K": lambda: all_gather_matmul(x, rand((8 + (r == 1), 6), 9, torch.float32), comm),
        "m": lambda: all_gather_matmul(rand((4 + (r == 1), 8), r, torch.float32), b, comm),
        "dtype": lambda: all_gather_matmul(x.to(torch.bfloat16 if r == 1 else torch.float32),
                                           b.to(torch.bfloat16 if r == 1 else torch.float32),
                                           comm),
        "float64": lambda: all_gather_matmul(x.double(), b.double(), comm),
        "rows": lambda: matmul_reduce_scatter(rand((w * 4 + 1, 8), r, torch.float32), b, comm),
        "N": lambda: matmul_reduce_scatter(rand((w * 4, 8), r, torch.float32),
                                           rand((8, 6 + r), 9, torch.float32), comm),
        "out": lambda: matmul_reduce_scatter(rand((w * 4, 8), r, torch.float32), b, comm,
                                             out=torch.empty(5 if r == 1 else 4, 6)),
        "not_tensor": lambda: all_gather_matmul(x if r != 1 else [1, 2], b, comm),
        "gathered": lambda: all_gather_matmul(x, b, comm, return_gathered=r == 1),
        "copy": lambda: all_gather_matmul(x, b, comm, copy="stream" if r == 1 else "kernel"),
        "copy_value": lambda: all_gather_matmul(x, b, comm, copy="dma" if r == 1 else "kernel"),
    }
    got = catch(calls[case])
    after = run_ag(comm, 3, 5, 4, torch.float32)[1]  # the communicator still works
    return got, after


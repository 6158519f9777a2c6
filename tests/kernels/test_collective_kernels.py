"""GPU collective kernels (all_reduce one_shot/two_shot, all_gather and reduce_scatter
direct/ring) through the Communicator, in the Triton interpreter.

Each rank process sets TRITON_INTERPRET=1 before triton is imported and switches its CPU
collectives to the kernels (``comm.use_cpu_kernels("triton")``): the same Communicator path,
TritonBackend handshake, epochs, staging and error check as CUDA tensors take on a GPU, on the
shared-memory heap. Data are integer-valued (exact in fp32 in any order); outputs are poisoned
(NaN / sentinel) before each call; every call runs twice in a row with different data; results
are compared with numpy and with the CPU schedule executor's answer for the same call.
"""

from __future__ import annotations

import gc
import os
import subprocess
import sys
import time

import numpy as np
import pytest
import torch

import tilecomm

pytestmark = pytest.mark.interpreter

KERNELS = [("all_reduce", "one_shot"), ("all_reduce", "two_shot"), ("all_gather", "direct"),
           ("all_gather", "ring"), ("reduce_scatter", "direct"), ("reduce_scatter", "ring")]


# ---- rank side ---------------------------------------------------------------------------------



def _poison(shape, dtype):
    return torch.full(shape, float("nan") if dtype.is_floating_point else -7, dtype=dtype)


def _input(coll, w, r, n, k, dtype):
    """Rank r's integer-valued input of round k (all_reduce: n; all_gather: n; reduce_scatter:
    w*n elements)."""
    size = w * n if coll == "reduce_scatter" else n
    base = torch.arange(size, dtype=torch.float64)
    return ((base * (r + 1) + 3 * k + r) % 61 - 30).to(dtype)


def _reference(coll, w, r, n, k, op="sum"):
    xs = np.stack([_input(coll, w, q, n, k, torch.float64).numpy() for q in range(w)])
    if coll == "all_gather":
        return xs.reshape(-1)
    red = {"sum": xs.sum(0), "max": xs.max(0), "min": xs.min(0), "avg": xs.sum(0) / w,
           "prod": xs.prod(0)}[op]
    return red if coll == "all_reduce" else red[r * n:(r + 1) * n]


def _run_one(comm, coll, algo, x, op, symmetric_out=False):
    if coll == "all_reduce":
        comm.all_reduce(x, op=op, algo=algo)
        return x
    if coll == "all_gather":
        out = _poison((comm.world_size * x.numel(),), x.dtype)
        return comm.all_gather(x, out, algo=algo)
    out = _poison((x.numel() // comm.world_size,), x.dtype)
    return comm.reduce_scatter(x, op=op, out=out, algo=algo)


def _exact(comm, n, rounds, ops):
    """Every kernel, fp32, twice in a row, vs numpy and vs the CPU executor."""
    w, r = comm.world_size, comm.rank
    checked = 0
    for coll, algo in KERNELS:
        for op in (ops if coll != "all_gather" else ("sum",)):
            for k in range(rounds):
                x = _input(coll, w, r, n, k, torch.float32)
                got = _run_one(comm, coll, algo, x.clone(), op).clone()
                np.testing.assert_array_equal(got.numpy(), _reference(coll, w, r, n, k, op),
                                              err_msg=f"{coll}/{algo} {op} round {k}")
                comm.use_cpu_kernels("executor")
                try:
                    ref = _run_one(comm, coll, algo, x.clone(), op)
                finally:
                    comm.use_cpu_kernels("triton")
                assert torch.equal(got, ref), f"{coll}/{algo} {op}: differs from the executor"
                checked += 1
    return checked


def _zero_copy(comm, n):
    """Inputs from comm.alloc (read by peers where they are), in place and out of place."""
    w, r = comm.world_size, comm.rank
    be = comm._backends["cpu"]
    for coll, algo in KERNELS:
        for k in range(2):
            size = w * n if coll == "reduce_scatter" else n
            x = comm.alloc(size, torch.float32)
            x.copy_(_input(coll, w, r, n, k, torch.float32))
            got = _run_one(comm, coll, algo, x, "sum").clone()
            np.testing.assert_array_equal(got.numpy(), _reference(coll, w, r, n, k),
                                          err_msg=f"zero copy {coll}/{algo} round {k}")
            assert be.ctx.zero_copy, f"{coll}/{algo}: heap input was staged"
            del x
            gc.collect()
    # a tensor outside the heap is staged
    _run_one(comm, "all_gather", "direct", torch.ones(n), "sum")
    assert not be.ctx.zero_copy
    return True


def _dtypes(comm, n):
    """fp16/bf16 (fp32 accumulation) against an fp32 reference with tolerance; int32, int64
    and fp64 exact."""
    w, r = comm.world_size, comm.rank
    g = torch.Generator().manual_seed(1234)
    data = [torch.randn(w * n, generator=g) for _ in range(w)]
    for dt, tol in ((torch.float16, 2e-3), (torch.bfloat16, 1.6e-2), (torch.int32, 0),
                    (torch.float64, 0), (torch.int64, 0)):
        for coll, algo in KERNELS:
            for k in range(2):
                if dt.is_floating_point and tol:
                    src = [(d * (k + 1))[: (w * n if coll == "reduce_scatter" else n)]
                           for d in data]
                    x = src[r].to(dt)
                    ref32 = torch.stack([s.to(dt).float() for s in src])
                    ref = (ref32.sum(0) if coll != "all_gather" else ref32.reshape(-1))
                    if coll == "reduce_scatter":
                        ref = ref[r * n:(r + 1) * n]
                else:
                    x = _input(coll, w, r, n, k, dt)
                    ref = torch.from_numpy(_reference(coll, w, r, n, k))
                got = _run_one(comm, coll, algo, x.clone(), "sum")
                assert got.dtype == dt
                if tol:
                    torch.testing.assert_close(got.float(), ref.float(), rtol=tol, atol=tol * 4,
                                               msg=f"{dt} {coll}/{algo}")
                else:
                    np.testing.assert_array_equal(got.double().numpy(), ref.double().numpy(),
                                                  err_msg=f"{dt} {coll}/{algo}")
    return True


def _two_shot_sizes(comm, sizes):
    """two_shot at sizes whose 16-byte-aligned chunks are uneven or empty (n < W * 16 B), in
    fp32 and bf16 (8 elements per 16 bytes), and one_shot / all_gather / reduce_scatter direct
    across a full block plus a tail; exact (integer data)."""
    w, r = comm.world_size, comm.rank
    checked = 0
    for dt in (torch.float32, torch.bfloat16):
        for n in sizes:
            for coll, algo in (("all_reduce", "two_shot"), ("all_reduce", "one_shot"),
                               ("all_gather", "direct"), ("reduce_scatter", "direct")):
                x = _input(coll, w, r, n, 1, dt)
                got = _run_one(comm, coll, algo, x, "sum")
                np.testing.assert_array_equal(got.to(torch.float64).numpy(),
                                              _reference(coll, w, r, n, 1),
                                              err_msg=f"{coll}/{algo} {dt} n={n}")
                checked += 1
    return checked


def _mixed(comm, n, rounds):
    """Different kernels back to back on the shared pad and scratch (contract rules 1-3)."""
    w, r = comm.world_size, comm.rank
    order = KERNELS * rounds
    for i, (coll, algo) in enumerate(order[r % 2:] + order[:r % 2] if False else order):
        x = _input(coll, w, r, n, i, torch.float32)
        got = _run_one(comm, coll, algo, x, "sum")
        np.testing.assert_array_equal(got.numpy(), _reference(coll, w, r, n, i),
                                      err_msg=f"{coll}/{algo} #{i}")
    return len(order)


def _silent_peer(comm, timeout):
    """Rank 0 never launches; rank 1 runs each kernel's launcher and must get CommTimeout."""
    from tilecomm.backends.base import CollectiveCall
    from tilecomm.backends.triton import registry
    from tilecomm.types import DTYPES, ReduceOp

    be = comm._backends["cpu"]
    w, n = comm.world_size, 64
    for coll, algo in KERNELS:      # every rank: scratch and pad exist (growing is collective)
        _run_one(comm, coll, algo, torch.ones(w * n if coll == "reduce_scatter" else n), "sum")
    be.heap.timeout = timeout
    if comm.rank == 0:
        return None
    out = []
    for coll, algo in KERNELS:
        if coll == "all_reduce":
            bufs = {"buf": torch.ones(n)}
        elif coll == "all_gather":
            bufs = {"in": torch.ones(n), "out": torch.zeros(w * n)}
        else:
            bufs = {"in": torch.ones(w * n), "out": torch.zeros(n)}
        call = CollectiveCall(coll, algo, DTYPES[torch.float32], n, bufs,
                              op=None if coll == "all_gather" else ReduceOp.SUM)
        be.ctx.begin(False)
        epoch = be.ctx.epoch
        t = time.perf_counter()
        registry.lookup(coll, algo, torch.float32, None).launch(be.ctx, call)
        elapsed = time.perf_counter() - t
        try:
            be.heap.check(f"{coll}/{algo}")
            out.append((coll, algo, "no error"))
        except tilecomm.CommTimeout as e:
            out.append((coll, algo, type(e).__name__, e.rank, e.peer, e.epoch == epoch,
                        str(e), elapsed))
    return out


def _unsupported(comm):
    """Every registered algorithm has a GPU path (fused or the plan kernel); what is still
    refused, on every rank: an unknown algorithm, a reduction on a movement-only dtype, and in
    deterministic mode an algorithm that does not reduce in rank order."""
    errs = []

    def deterministic_ring():
        comm.deterministic = True
        try:
            comm.all_reduce(torch.ones(8), algo="ring")
        finally:
            comm.deterministic = False

    for fn in (lambda: comm.all_reduce(torch.ones(8), algo="bogus"),
               lambda: comm.all_reduce(torch.ones(8, dtype=torch.uint8)),
               deterministic_ring):
        try:
            fn()
            errs.append("no error")
        except (ValueError, TypeError) as e:
            errs.append(f"{type(e).__name__}: {e}")
    # still usable afterwards, and ring (the plan kernel) runs
    x = torch.full((8,), float(comm.rank + 1))
    comm.all_reduce(x, algo="ring")
    errs.append(x.tolist())
    return errs


def _auto(comm):
    from tilecomm import tuner
    be = comm._backends["cpu"]
    small = tuner.choose("all_reduce", 1024, comm.world_size, kind=be.kind,
                         available=be.algorithms("all_reduce"))
    big = tuner.choose("all_reduce", 1 << 30, comm.world_size, kind=be.kind,
                       available=be.algorithms("all_reduce"))
    x = torch.full((100,), 1.0)
    comm.all_reduce(x)              # auto on the kernel backend
    return small, big, x[0].item(), be.algorithms("all_gather")


# ---- pools -------------------------------------------------------------------------------------

# ---- tests -------------------------------------------------------------------------------------

@pytest.mark.slow
@pytest.mark.parametrize("w", [2, 3])
def test_every_kernel_exact_vs_numpy_and_executor(w, rank_pool):
    # n not a multiple of the block (128) nor of w: masked tails and uneven two_shot chunks
    ops = ("sum", "max") if w == 3 else ("sum", "avg")
    res = rank_pool(w, "kernels").run(_exact, 157, 2, ops)
    assert res == [2 * (4 * 2 + 2)] * w   # (4 reducing kernels x 2 ops + 2 all_gathers) x 2 rounds


def test_aligned_chunks_and_full_block_paths_small_and_odd_sizes(rank_pool):
    # two_shot's chunk starts are rounded down to 16 bytes (the last chunk takes the rest):
    # n = 1, 5 leave most chunks empty; 37 and 300 (> one 128-element block) uneven ones;
    # 256 is two full blocks (the unmasked path only), 300 full blocks and a tail
    sizes = [1, 5, 37, 256, 300]
    assert rank_pool(3, "kernels").run(_two_shot_sizes, sizes) == [2 * len(sizes) * 4] * 3


def test_four_ranks_mixed_sequence(rank_pool):
    assert rank_pool(4, "kernels").run(_mixed, 150, 2) == [12] * 4


@pytest.mark.parametrize("w", [2, 3])
def test_zero_copy_heap_inputs(w, rank_pool):
    assert rank_pool(w, "kernels").run(_zero_copy, 140) == [True] * w


@pytest.mark.slow
def test_low_precision_and_integer_dtypes(rank_pool):
    assert rank_pool(3, "kernels").run(_dtypes, 70) == [True] * 3


def test_unsupported_calls_name_what_is_supported(rank_pool):
    res = rank_pool(2, "kernels").run(_unsupported)
    for errs in res:
        assert errs[0].startswith("ValueError") and "one_shot" in errs[0] and \
            "recursive_doubling" in errs[0], errs[0]
        assert errs[1].startswith("TypeError") and "uint8" in errs[1], errs[1]
        assert errs[2].startswith("ValueError") and "'ring'" in errs[2] and \
            "one_shot, two_shot" in errs[2], errs[2]
        assert errs[3] == [3.0] * 8


def test_auto_picks_gpu_kernels(rank_pool):
    res = rank_pool(2, "kernels").run(_auto)
    small, big, val, ag = res[0]
    # auto follows the GPU preset's predictions: one synchronization at 1 KiB, an algorithm
    # that moves 2(W-1)/W of the message at 1 GiB (two_shot and ring tie on 2 GPUs)
    assert small == "one_shot" and big in ("two_shot", "ring") and val == 2.0, (small, big, val)
    assert set(ag) == {"direct", "ring"}


@pytest.mark.slow
def test_silent_peer_raises_commtimeout(rank_pool):
    t = time.perf_counter()
    res = rank_pool(2, "kernels").run_and_discard(_silent_peer, 0.3)
    assert time.perf_counter() - t < 40
    assert res[0] is None
    assert len(res[1]) == len(KERNELS)
    for coll, algo, name, rank, peer, same_epoch, msg, elapsed in res[1]:
        assert name == "DeviceTimeout", (coll, algo, name)
        assert (rank, peer, same_epoch) == (1, 0, True), (coll, algo, rank, peer)
        assert f"{coll}/{algo}: rank 1 timed out" in msg and "rank 0" in msg and "epoch" in msg
        assert 0.3 <= elapsed < 15


def _env():
    return {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}


@pytest.mark.slow
@pytest.mark.compile
@pytest.mark.timeout(600)      # compiling every kernel takes 1-2 minutes on 2 cores
def test_every_registered_kernel_compiles_for_sm90():
    from tilecomm.backends.triton import registry

    mods = [f"tilecomm.backends.triton.kernels.{f}" for f in registry.FAMILIES
            if os.path.exists(os.path.join(os.path.dirname(registry.__file__), "kernels",
                                           f + ".py"))]
    assert "tilecomm.backends.triton.kernels.all_reduce" in mods
    r = subprocess.run([sys.executable, "-m", "tilecomm.device.compile_check", "--jobs", "2",
                        *mods], env=_env(), capture_output=True, text=True, timeout=540)
    if r.returncode == 3:
        pytest.skip(r.stderr.strip())
    assert r.returncode == 0, r.stdout + r.stderr
    ok = " ".join(line for line in r.stdout.splitlines() if line.startswith("ok "))
    for name in ("one_shot_all_reduce_kernel", "two_shot_all_reduce_kernel",
                 "all_gather_direct_kernel", "all_gather_ring_kernel",
                 "reduce_scatter_direct_kernel", "reduce_scatter_ring_kernel"):
        assert name in ok, r.stdout


def _huge(comm):
    """Calls whose int32 offsets would wrap (W * n >= 2^31): refused before any launch."""
    from tilecomm.backends.base import CollectiveCall
    from tilecomm.backends.triton import registry
    from tilecomm.types import DTYPES, ReduceOp

    be = comm._backends["cpu"]
    w, n = comm.world_size, (1 << 30) + 8          # no memory: zero-stride views
    big, small = torch.zeros(1).expand(n), torch.zeros(1).expand(w * n)
    errs = []
    for coll, algo in KERNELS:
        if algo == "one_shot":      # indexes up to n only: n < 2^31 is enough
            continue
        if coll == "all_reduce":
            bufs = {"buf": big}
        elif coll == "all_gather":
            bufs = {"in": big, "out": small}
        else:
            bufs = {"in": small, "out": big}
        call = CollectiveCall(coll, algo, DTYPES[torch.float32], n, bufs,
                              op=None if coll == "all_gather" else ReduceOp.SUM)
        try:
            registry.lookup(coll, algo, torch.float32, None).launch(be.ctx, call)
            errs.append("no error")
        except ValueError as e:
            errs.append(str(e))
    return errs


def test_int32_offsets_that_would_wrap_are_refused(rank_pool):
    from tilecomm.backends.triton import registry

    registry.check_int32("all_gather", "direct", (1 << 31) - (1 << 23))
    with pytest.raises(ValueError, match="int32"):
        registry.check_int32("all_gather", "direct", 1 << 31)
    errs = rank_pool(2, "kernels").run(_huge)
    assert len(errs[0]) == len(KERNELS) - 1
    for e in errs[0]:
        assert "exceed what the GPU kernel indexes with int32" in e, errs[0]

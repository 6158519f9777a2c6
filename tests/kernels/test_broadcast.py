"""GPU kernel direct broadcast, run in the Triton interpreter (see test_all_to_all.py for
how the rank processes are prepared). Every root, every dtype, poisoned outputs, consecutive
calls, staged and zero-copy (heap tensor) sources, a silent root."""

from __future__ import annotations


import numpy as np
import pytest
import torch

import tilecomm
from interp_ranks import compile_for_sm90, kernel_backend

pytestmark = pytest.mark.interpreter

DTYPES = [torch.float32, torch.bfloat16, torch.float16, torch.float64, torch.int32,
          torch.int64, torch.uint8, torch.int8]
POISON = 77


def _data(root, n, k):
    return (np.arange(n) * 7 + root * 13 + k * 5) % 100


def _bcast(comm, n, dtypes, roots, heap_tensor):
    from tilecomm.backends.base import CollectiveCall
    from tilecomm.types import lookup_dtype

    b, r = kernel_backend(comm), comm.rank
    done = 0
    for dt in dtypes:
        buf = b.alloc(n, dt) if heap_tensor else torch.empty(n, dtype=dt)
        for k, root in enumerate(roots):
            want = torch.from_numpy(_data(root, n, k)).to(dt)
            buf.copy_(want if r == root else torch.full((n,), POISON, dtype=dt))
            b.run(CollectiveCall("broadcast", "direct", lookup_dtype(dt), n, {"buf": buf},
                                 root=root))
            assert b.ctx.zero_copy == (heap_tensor and n > 0), b.ctx.zero_copy
            if not torch.equal(buf, want):
                bad = (buf != want).nonzero().flatten()
                raise AssertionError(f"{dt} root {root} call {k}: {len(bad)} wrong, first at "
                                     f"{int(bad[0])}: {buf[bad[0]]} != {want[bad[0]]}")
            done += 1
        del buf
    return done


def _silent_root(comm):
    """Rank 0 (the root) skips a launch that rank 1 makes: rank 1 must time out."""
    import time

    from tilecomm.backends.base import CollectiveCall
    from tilecomm.backends.triton import TritonBackend, registry
    from tilecomm.types import lookup_dtype

    b = TritonBackend(comm, "cpu", timeout=0.3)
    buf = torch.zeros(10)
    call = CollectiveCall("broadcast", "direct", lookup_dtype(torch.float32), 10, {"buf": buf},
                          root=0)
    b.run(call)                     # warm: the staging allocation is collective
    if comm.rank == 0:
        b.host.barrier()
        return None
    b.ctx.begin(False)
    t = time.perf_counter()
    try:
        registry.lookup("broadcast", "direct", torch.float32, None).launch(b.ctx, call)
        b.heap.check("broadcast")
    except tilecomm.CommTimeout as e:
        res = (type(e).__name__, e.rank, e.peer, e.epoch, b.ctx.epoch, e.site, str(e),
               time.perf_counter() - t)
    else:
        res = ("no error",)
    b.host.barrier()
    return res


def test_broadcast_every_dtype_and_root_two_ranks(rank_pool):
    # 45 elements: odd byte counts for the 1-byte types; roots 0, 1, 1, 0 (same root twice too)
    assert rank_pool(2, "interpreter").run(_bcast, 45, DTYPES, [0, 1, 1, 0], False) == [32, 32]


@pytest.mark.parametrize("w", [3, 4])
def test_broadcast_every_root(rank_pool, w):
    # 4 ranks x 600 elements: several blocks per program, several programs
    n = 600 if w == 4 else 33
    dts = [torch.bfloat16] if w == 4 else [torch.float32, torch.int64]
    roots = list(range(w)) + [w - 1]
    got = rank_pool(w, "interpreter").run(_bcast, n, dts, roots, False)
    assert got == [len(roots) * len(dts)] * w


def test_broadcast_zero_copy_heap_tensor(rank_pool):
    # every rank's buf at the same heap offset: peers read the root's buf directly
    got = rank_pool(3, "interpreter").run(_bcast, 200, [torch.float16], [2, 0, 1, 1], True)
    assert got == [4] * 3


def test_broadcast_sizes_change_between_calls(rank_pool):
    # growing, shrinking and empty buffers on consecutive calls
    res = []
    for n in (5, 300, 17, 0, 301):
        res.append(rank_pool(2, "interpreter").run(_bcast, n, [torch.float32], [1, 0], False))
    assert res == [[2, 2]] * 5


def test_silent_root_raises_commtimeout(rank_pool):
    res = rank_pool(2, "interpreter").run_and_discard(_silent_root)
    assert res[0] is None
    name, rank, peer, epoch, ctx_epoch, site, msg, elapsed = res[1]
    assert name == "DeviceTimeout", res
    assert (rank, peer, epoch) == (1, 0, ctx_epoch) and site in (1, 2), res
    assert "broadcast" in msg and "rank 1 timed out" in msg and f"epoch {epoch}" in msg, msg
    assert 0.3 <= elapsed < 10


@pytest.mark.slow
@pytest.mark.compile
def test_compiles_for_sm90():
    out = compile_for_sm90("tilecomm.backends.triton.kernels.broadcast")
    ok = [ln for ln in out.splitlines() if ln.startswith("ok ")]
    assert len(ok) == 6 and "direct_broadcast" in out, out

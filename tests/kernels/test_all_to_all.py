"""GPU kernels pairwise all_to_all / all_to_all_v, run in the Triton interpreter.

Each rank process sets TRITON_INTERPRET=1 before triton is imported and drives a
``TritonBackend(comm, "cpu")`` (shared-memory heap): the same launchers, handshake, epochs and
error check as on a GPU. Data are small integers (exact in every dtype), outputs are poisoned
first, and every call is made twice in a row with different data.
"""

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


# ---- rank side ---------------------------------------------------------------------------------

def _value(src, dst, i, k):
    """Element i of the chunk rank ``src`` sends to ``dst`` in round ``k`` (fits in int8)."""
    return (src * 31 + dst * 7 + i * 3 + k * 11) % 100


def _a2a(comm, m, dtypes, rounds):
    from tilecomm.backends.base import CollectiveCall
    from tilecomm.types import lookup_dtype

    b, w, r = kernel_backend(comm), comm.world_size, comm.rank
    i = np.arange(m)
    for dt in dtypes:
        for k in range(rounds):
            x = torch.from_numpy(np.concatenate([_value(r, j, i, k) for j in range(w)])).to(dt)
            out = torch.full((w * m,), POISON, dtype=dt)
            b.run(CollectiveCall("all_to_all", "pairwise", lookup_dtype(dt), w * m,
                                 {"in": x, "out": out}))
            want = np.concatenate([_value(j, r, i, k) for j in range(w)])
            got = out.to(torch.float64).numpy()
            if not np.array_equal(got, want):
                bad = np.flatnonzero(got != want)
                raise AssertionError(f"{dt} round {k}: {len(bad)} wrong, first at {bad[0]}: "
                                     f"{got[bad[0]]} != {want[bad[0]]}")
            assert torch.equal(x, torch.from_numpy(np.concatenate(
                [_value(r, j, i, k) for j in range(w)])).to(dt)), "input modified"
    return len(dtypes) * rounds


def _a2av(comm, matrices, row, dt, give_recv):
    """``matrices``: one count matrix (rows) per consecutive call."""
    from tilecomm.backends.base import CollectiveCall
    from tilecomm.types import lookup_dtype

    b, w, r = kernel_backend(comm), comm.world_size, comm.rank
    for k, mat in enumerate(matrices):
        send = mat[r]
        recv = [mat[p][r] for p in range(w)]
        chunks = [_value(r, j, np.arange(c * row), k) for j, c in enumerate(send)]
        x = torch.from_numpy(np.concatenate(chunks)).to(dt)
        holder = []

        def make_out(rows, holder=holder):
            holder.append(torch.full((rows * row,), POISON, dtype=dt))
            return holder[-1]

        bufs = {"in": x}
        if give_recv:
            bufs["out"] = make_out(sum(recv))
        b.run(CollectiveCall("all_to_all_v", "pairwise", lookup_dtype(dt), row, bufs,
                             send_rows=send, recv_rows=recv if give_recv else None,
                             make_out=make_out))
        assert len(holder) == 1, f"make_out called {len(holder)} times"
        want = np.concatenate([_value(p, r, np.arange(recv[p] * row), k) for p in range(w)])
        got = holder[0].to(torch.float64).numpy()
        assert got.shape == want.shape, (got.shape, want.shape)
        assert np.array_equal(got, want), (k, got.tolist(), want.tolist())
    return len(matrices)


def _a2av_mismatch(comm):
    from tilecomm.backends.base import CollectiveCall
    from tilecomm.types import lookup_dtype

    b, w, r = kernel_backend(comm), comm.world_size, comm.rank
    send = [1] * w
    recv = [1] * w
    if r == 1:
        recv[0] = 2              # rank 1 wrongly expects 2 rows from rank 0
    x = torch.ones(w, dtype=torch.float32)
    out = torch.empty(sum(recv), dtype=torch.float32)
    try:
        b.run(CollectiveCall("all_to_all_v", "pairwise", lookup_dtype(torch.float32), 1,
                             {"in": x, "out": out}, send_rows=send, recv_rows=recv))
    except tilecomm.CommMismatch as e:
        return str(e)
    return None


def _silent_peer(comm, collective):
    """Rank 0 skips a launch that rank 1 makes: rank 1 must raise a DeviceTimeout."""
    import time

    from tilecomm.backends.base import CollectiveCall
    from tilecomm.backends.triton import TritonBackend
    from tilecomm.types import lookup_dtype

    b = TritonBackend(comm, "cpu", timeout=0.3)        # own heap epochs, own pad and scratch
    w = comm.world_size
    d = lookup_dtype(torch.float32)
    x = torch.arange(w * 4, dtype=torch.float32)

    def call():
        if collective == "all_to_all":
            return CollectiveCall("all_to_all", "pairwise", d, w * 4,
                                  {"in": x, "out": torch.empty_like(x)})
        return CollectiveCall("all_to_all_v", "pairwise", d, 1, {"in": x},
                              send_rows=[4] * w, recv_rows=None,
                              make_out=lambda rows: torch.empty(rows))

    from tilecomm.backends.triton import registry

    launch = registry.lookup(collective, "pairwise", torch.float32, None).launch
    b.run(call())                  # warm: allocations (collective) happen in the first call
    if comm.rank == 0:
        b.host.barrier()
        return None
    b.ctx.begin(False)             # no host handshake: the device wait must catch it
    t = time.perf_counter()
    try:
        launch(b.ctx, call())
        b.heap.check(collective)
    except tilecomm.CommTimeout as e:
        res = (type(e).__name__, e.rank, e.peer, e.epoch, b.ctx.epoch, str(e),
               time.perf_counter() - t)
    else:
        res = ("no error",)
    b.host.barrier()
    return res


# ---- pytest side -------------------------------------------------------------------------------


def test_all_to_all_every_dtype_two_ranks(rank_pool):
    # 37 elements per chunk: odd byte lengths for the 1- and 2-byte types (uint8/int16 words)
    assert rank_pool(2, "interpreter").run(_a2a, 37, DTYPES, 2) == [16, 16]


@pytest.mark.parametrize("w", [3, 4])
def test_all_to_all_more_ranks(rank_pool, w):
    # 4 ranks x 150 elements: several blocks and programs per step
    dts = [torch.float32, torch.bfloat16] if w == 4 else [torch.float16, torch.int64]
    assert rank_pool(w, "interpreter").run(_a2a, 150 if w == 4 else 9, dts, 2) == [4] * w


def test_all_to_all_empty_chunks(rank_pool):
    assert rank_pool(2, "interpreter").run(_a2a, 0, [torch.float32], 2) == [2, 2]


@pytest.mark.parametrize("w,row,dt", [(2, 3, torch.bfloat16), (3, 1, torch.float32),
                                      (4, 2, torch.int32)])
def test_all_to_all_v_uneven(rank_pool, w, row, dt):
    rng = np.random.default_rng(w)
    first = rng.integers(0, 6, size=(w, w)).tolist()
    first[0] = [0] * w                     # rank 0 sends nothing
    for j in range(w):
        first[j][w - 1] = 0                # rank w-1 receives nothing
    second = (rng.integers(0, 40, size=(w, w)) * (rng.random((w, w)) > 0.3)).tolist()
    # the second call's larger counts grow the staging (host barrier path)
    for give_recv in (False, True):
        got = rank_pool(w, "interpreter").run(_a2av, [first, second], row, dt, give_recv)
        assert got == [2] * w


def test_all_to_all_v_all_zero_and_odd_bytes(rank_pool):
    # uint8 with odd counts: moved as single bytes; then a call where nobody sends anything
    mats = [[[3, 5], [7, 1]], [[0, 0], [0, 0]], [[1, 0], [0, 2]]]
    assert rank_pool(2, "interpreter").run(_a2av, mats, 1, torch.uint8, False) == [3, 3]


def test_all_to_all_v_recv_counts_mismatch_raises_everywhere(rank_pool):
    msgs = rank_pool(2, "interpreter").run(_a2av_mismatch)
    for m in msgs:
        assert m is not None and "rank 1 expects 2 rows from rank 0, which sends 1" in m, msgs
    # the pool still works afterwards
    assert rank_pool(2, "interpreter").run(_a2a, 5, [torch.float32], 1) == [1, 1]


@pytest.mark.parametrize("collective", ["all_to_all", "all_to_all_v"])
def test_silent_peer_raises_commtimeout(rank_pool, collective):
    res = rank_pool(2, "interpreter").run_and_discard(_silent_peer, collective)
    assert res[0] is None
    name, rank, peer, epoch, ctx_epoch, msg, elapsed = res[1]
    assert name == "DeviceTimeout", res
    assert (rank, peer) == (1, 0) and epoch == ctx_epoch, res
    assert "rank 1 timed out" in msg and f"epoch {epoch}" in msg, msg
    assert 0.3 <= elapsed < 10


@pytest.mark.slow
@pytest.mark.compile
def test_compiles_for_sm90():
    out = compile_for_sm90("tilecomm.backends.triton.kernels.all_to_all")
    ok = [ln for ln in out.splitlines() if ln.startswith("ok ")]
    # 4 word sizes x ALIGNED 0/1 at 8 ranks, one at 2 ranks, the counts kernel
    assert len(ok) == 10 and "pairwise_all_to_all" in out and \
        "all_to_all_v_counts" in out, out


def test_all_to_all_v_large_local_chunk_same_grid_everywhere(rank_pool):
    # rank 0 keeps 600 rows for itself (its diagonal) and sends 1: the grid must be sized from
    # the whole count matrix, the same on every rank (program (pid, s) meets the peer's
    # (pid, s)); sized from a rank's own counts, rank 0's extra programs waited on programs
    # rank 1 never launched and timed out
    mats = [[[600, 1], [1, 1]], [[1, 2], [3, 500]]]
    assert rank_pool(2, "interpreter").run(_a2av, mats, 1, torch.int64, True) == [2, 2]

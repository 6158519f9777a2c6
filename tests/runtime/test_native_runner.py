"""The CPU executor's native runner (backends/cpu/_native.c) against its Python path.

The two engines run the same plan, so they must give the same bits on random floats (not
only on the integer-valued data of test_collectives), meet each other inside one collective
(one rank native, the other Python), and keep every error promise: a mismatch raises
CommMismatch on every rank, a silent peer CommTimeout naming it, a peer that moves its buffer
into (or out of) symmetric memory between calls is followed.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

import tilecomm
from tilecomm import CommMismatch, CommTimeout
from tilecomm.algorithms import algorithms
from tilecomm.backends.cpu import native
from tilecomm.backends.cpu.plan import _reduce_f32, _reduce_np
from tilecomm.types import NP_UFUNC, TORCH_FN, DTYPES, ReduceOp

from .data import random_values as _random

pytestmark = pytest.mark.skipif(native._native is None,
                                reason="the native runner was not built (no C compiler)")

FLOATS = [torch.float32, torch.float64, torch.float16, torch.bfloat16]
INTS = [torch.int32, torch.int64]
OPS = [ReduceOp.SUM, ReduceOp.PROD, ReduceOp.MIN, ReduceOp.MAX, ReduceOp.AVG]


def _python_reduce(operands: list[torch.Tensor], op: ReduceOp, scale: int) -> torch.Tensor:
    """What the executor's Python path computes for ``dst = operands[0] op operands[1] ...``."""
    d = DTYPES[operands[0].dtype]
    out = torch.empty_like(operands[0])
    if d.numpy is None:
        n = out.numel()
        if len(operands) == 2 and not scale:
            TORCH_FN[op](operands[0], operands[1], out=out)
        else:
            _reduce_f32(out, operands, op, scale, torch.empty(n), torch.empty(n))
        return out
    arrs = [t.numpy() for t in operands]
    with np.errstate(all="ignore"):
        _reduce_np(out.numpy(), arrs, NP_UFUNC[op], scale, np.empty_like(arrs[0]))
    return out


@pytest.mark.parametrize("dtype", FLOATS + INTS, ids=str)
@pytest.mark.parametrize("op", OPS, ids=lambda o: o.value)
@pytest.mark.parametrize("nops", [2, 3, 5])
def test_reduction_bits_equal_the_python_path(dtype, op, nops):
    """Random data over several blocks (the runner works in blocks of 512 elements)."""
    if op is ReduceOp.AVG and not dtype.is_floating_point and nops == 5:
        pytest.skip("covered at 2 and 3 operands")
    n = 1500
    ops = [_random(100 * nops + i, n, dtype) for i in range(nops)]
    if dtype.is_floating_point:      # NaN, infinities, signed zeros, subnormals
        ops[0][:6] = torch.tensor([float("nan"), float("inf"), -float("inf"), -0.0, 0.0, 1e-40],
                                  dtype=torch.float64).to(dtype)
    scale = nops if op is ReduceOp.AVG else 0
    want = _python_reduce(ops, op, scale)
    got = torch.empty_like(ops[0])
    native._native.reduce_into(native.DTYPE_CODES[DTYPES[dtype].id], native.OP_CODES[op], scale,
                               n, got.data_ptr(), *[t.data_ptr() for t in ops])
    w, g = want.view(torch.uint8 if dtype.itemsize == 1 else
                     {2: torch.int16, 4: torch.int32, 8: torch.int64}[dtype.itemsize]), \
        got.view({2: torch.int16, 4: torch.int32, 8: torch.int64}[dtype.itemsize])
    nan = torch.isnan(want) if dtype.is_floating_point else torch.zeros(n, dtype=torch.bool)
    assert torch.equal(torch.isnan(got) if dtype.is_floating_point else nan, nan)
    bad = (w != g) & ~nan        # NaN payloads may differ (torch's own paths differ there)
    assert not bad.any(), f"{int(bad.sum())} of {n} differ, first at {int(bad.nonzero()[0])}"


def test_16_bit_rounding_at_every_midpoint():
    """Sums that land exactly halfway between two neighbouring 16-bit values (the hard cases
    of nearest-even rounding), for every finite positive float16 and a sweep of bfloat16,
    against torch's 16-bit add (widen, add in float32, round once)."""
    for dtype, top in ((torch.float16, 0x7C00), (torch.bfloat16, 0x7F80)):
        h = torch.arange(0, top, 7 if dtype == torch.bfloat16 else 1,
                         dtype=torch.int32).to(torch.int16).view(dtype)
        lo, hi = h[:-1].float(), h[1:].float()
        half_gap = ((hi - lo) / 2).to(dtype)
        exact = half_gap.float() == (hi - lo) / 2          # representable: a true midpoint
        a = torch.cat([h[:-1][exact], -h[:-1][exact], h[:-1]])
        b = torch.cat([half_gap[exact], -half_gap[exact], h[1:]])   # and plain neighbour sums
        want = torch.add(a, b)
        got = torch.empty_like(a)
        native._native.reduce_into(native.DTYPE_CODES[DTYPES[dtype].id], 0, 0, a.numel(),
                                   got.data_ptr(), a.data_ptr(), b.data_ptr())
        assert torch.equal(got.view(torch.int16), want.view(torch.int16)), dtype


# ---- whole collectives on ranks ------------------------------------------------------------
def _collectives(comm, cases, mode):
    """Run every case; ``mode``: "native", "python", or "mixed" (rank 0 native)."""
    ex = comm._backend.executor
    ex.native = mode == "native" or (mode == "mixed" and comm.rank == 0)
    was_deterministic, comm.deterministic = comm.deterministic, False   # a pooled rank
    outs = []
    try:
        for coll, algo, n, dtype, op, seed in cases:
            for repeat in range(3):     # the first run of a template is Python: repeat
                t = _random(seed * 31 + comm.rank, n, dtype)
                if coll == "all_reduce":
                    out = comm.all_reduce(t, op, algo=algo)
                elif coll == "reduce_scatter":
                    out = comm.reduce_scatter(t, op, algo=algo)
                elif coll == "all_gather":
                    out = comm.all_gather(t, algo=algo)
                elif coll == "broadcast":
                    out = comm.broadcast(t, root=comm.world_size - 1, algo=algo)
                elif coll == "reduce":
                    out = comm.reduce(t, root=1, op=op, algo=algo)
                else:
                    out = comm.all_to_all(t, algo=algo)
            outs.append(out.view(torch.uint8).clone())
        if ex.native:
            assert _native_used(comm), "no native program was built"
    finally:
        ex.native = native.enabled(comm.world_size)
        comm.deterministic = was_deterministic
    return outs


def _cases(world: int):
    cases = []
    sizes = [5, 3000, 300_000]      # 300k float32 run in pieces of the test scratch
    for coll in ["all_reduce", "reduce_scatter", "all_gather", "broadcast", "reduce",
                 "all_to_all"]:
        for algo in algorithms(coll):
            for i, n in enumerate(sizes):
                n -= n % world
                for dtype in ([torch.float32, torch.bfloat16] if n < 10_000 else
                              [torch.float32]):
                    op = "avg" if (i == 1 and dtype.is_floating_point and
                                   coll in ("all_reduce", "reduce_scatter")) else "sum"
                    cases.append((coll, algo, n, dtype, op, len(cases)))
    return cases


@pytest.mark.slow
@pytest.mark.parametrize("world_size", [2, 3])
def test_native_python_and_mixed_ranks_give_the_same_bits(rank_pool, world_size):
    group = rank_pool(world_size)
    cases = _cases(world_size)
    py = group.run(_collectives, cases, "python")
    nat = group.run(_collectives, cases, "native")
    mixed = group.run(_collectives, cases, "mixed")
    for r in range(world_size):
        for c, case in enumerate(cases):
            assert torch.equal(nat[r][c], py[r][c]), f"native, rank {r}: {case}"
            assert torch.equal(mixed[r][c], py[r][c]), f"mixed, rank {r}: {case}"


def _native_used(comm):
    """Whether the executor has a native program for the last call's template."""
    ex = comm._backend.executor
    return any(t.native is not None for t in ex._templates.values())


def _mismatch_after_native(comm):
    x = torch.ones(8)
    for _ in range(3):
        comm.all_reduce(x)
    assert _native_used(comm)
    y = torch.ones(8, dtype=torch.float64 if comm.rank == 0 else torch.float32)
    try:
        comm.all_reduce(y)
    except CommMismatch as e:
        err = str(e)
    else:
        err = None
    comm.all_reduce(x)       # the communicator stays usable after a mismatch
    return err, float(x[0])


def test_mismatch_on_a_native_call_raises_on_every_rank(rank_pool):
    out = rank_pool(2).run(_mismatch_after_native)
    for err, x0 in out:
        assert err is not None and "dtype" in err and "rank 0: float64" in err, err
        assert x0 == 16.0


def _switch_places(comm):
    """A buffer in symmetric memory on one rank, an ordinary tensor on the other, then the
    other way round: the native programs built for one placement must notice the other."""
    outs = []
    heap = comm.alloc((4096,), torch.float32)
    plain = torch.empty(4096)
    for i in range(6):
        t = heap if (i // 2 + comm.rank) % 2 else plain
        t.copy_(_random(i * 7 + comm.rank, 4096, torch.float32))
        comm.all_reduce(t, algo="two_shot")
        outs.append(t.clone())
    return outs


def test_peers_changing_placement_between_native_calls(rank_pool):
    out = rank_pool(2).run(_switch_places)
    for i in range(6):
        a, b = (_random(i * 7 + r, 4096, torch.float32) for r in range(2))
        want = a + b        # two operands: one rounding in any order
        assert torch.equal(out[0][i], want) and torch.equal(out[1][i], want), i


def _silent_peer(comm):
    x = torch.ones(8)
    for _ in range(3):
        comm.all_reduce(x)
    if comm.rank == 1:
        return None          # never makes the fourth call
    try:
        comm.all_reduce(x)
    except CommTimeout as e:
        return str(e), e.missing
    return None


def test_silent_peer_times_out_naming_it():
    out = tilecomm.launch(_silent_peer, 2, timeout=0.5)
    msg, missing = out[0]
    assert missing == (1,) and "all_reduce #" in msg and "rank(s) [1]" in msg, msg


# ---- folding a copy into the reduction that makes its source --------------------------------
def _op(dst, *srcs, first=False, chunk=8):
    from tilecomm.backends.cpu.plan import Op
    return Op(dst, tuple(srcs), first, chunk)


def test_fold_copies_folds_two_shots_copy_back_and_nothing_unsafe():
    from tilecomm.backends.cpu.plan import Operand
    mine = Operand(None, "buf", 0, 32)          # this rank's tensor, chunk 0
    other = Operand(None, "buf", 32, 32)        # chunk 1
    tmp = Operand(0, "tmp", 1000, 0)            # own scratch slot peers read
    peer_tmp = Operand(1, "tmp", 1000, 0)
    reduce_ = _op(tmp, mine, peer_tmp)
    copy_back = _op(mine, tmp)
    fetch = _op(other, Operand(1, "tmp", 2000, 0))
    folded = native.fold_copies([[reduce_], [copy_back, fetch]])
    assert folded == [[native.Folded(reduce_, mine)], [fetch]]
    # something touching the destination in between: the copy stays where it is
    touch = _op(mine, Operand(1, "tmp", 3000, 0))
    assert native.fold_copies([[reduce_, touch], [copy_back]]) == [[reduce_, touch], [copy_back]]
    assert native.fold_copies([[reduce_], [fetch, _op(other, mine), copy_back]])[1][-1] == \
        copy_back
    # a destination peers can read (symmetric memory) is never written early
    sym = Operand(0, "buf", 4096, 32)
    assert native.fold_copies([[reduce_], [_op(sym, tmp)]]) == [[reduce_], [_op(sym, tmp)]]


def _engine(comm):
    x = torch.arange(6, dtype=torch.float32) * (comm.rank + 1)
    for _ in range(3):
        y = x.clone()
        comm.all_reduce(y)
    return comm._backend.executor.native, y


def test_tilecomm_native_0_runs_the_python_path(monkeypatch):
    from tilecomm.settings import settings
    monkeypatch.setenv("TILECOMM_NATIVE", "0")
    settings.cache_clear()
    try:
        out = tilecomm.launch(_engine, 2)
    finally:
        monkeypatch.delenv("TILECOMM_NATIVE")
        settings.cache_clear()
    for used, y in out:
        assert used is False and torch.equal(y, torch.arange(6, dtype=torch.float32) * 3)

"""MoE dispatch/combine on the CPU engine (ranks from tilecomm.launch, shared memory): every
layout against the token-by-token reference, bit for bit, and the error promises."""

import sys
from pathlib import Path

import pytest
import torch
from shm_files import tilecomm_files

import tilecomm
from tilecomm import CommMismatch
from tilecomm.moe import ExpertParallel

sys.path.insert(0, str(Path(__file__).resolve().parent))
import moe_scenarios as S  # noqa: E402


@pytest.fixture(autouse=True)
def no_shm_left():
    before = tilecomm_files()
    yield
    assert tilecomm_files() <= before


@pytest.mark.parametrize("tokens,dtype,integer", [
    ([5, 3], torch.bfloat16, False),           # random floats: exact bits
    ([7, 0, 4, 9], torch.bfloat16, False),     # a rank with no tokens
    ([6, 2, 5, 1], torch.float32, True),       # integer-valued
    ([9, 8, 9, 7], torch.float32, False),      # float32 sums round: the order shows
])
def test_roundtrip_every_layout_matches_reference(tokens, dtype, integer):
    res = tilecomm.launch(S.roundtrip, len(tokens), tokens, 1, dtype, integer, timeout=60)
    S.check(res, tokens, seed=1, dtype=dtype, integer=integer)


def test_fp8_rows_and_scales_travel_together():
    tokens = [6, 4, 3]
    res = tilecomm.launch(S.roundtrip, 3, tokens, 2, torch.bfloat16, False, True,
                          ("normal", "grouped", "low_latency"), None, 12, timeout=60)
    S.check(res, tokens, seed=2, fp8=True, e=12)


def _quantize_one_pass(x):
    """fp8.quantize as one pass over x, written out: |x|, block amax, scale, divide, cast."""
    from tilecomm.moe import fp8
    t, h = x.shape
    xf = x.to(torch.float32).reshape(t, h // 128, 128)
    amax = xf.abs().amax(dim=-1)
    scales = torch.where(amax > 0, amax * fp8._INV_MAX, torch.ones((), dtype=torch.float32))
    return (xf / scales.unsqueeze(-1)).to(fp8.DTYPE).reshape(t, h), scales


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_fp8_quantize_in_passes_gives_the_one_pass_bytes(dtype):
    from tilecomm.moe import fp8
    h = 256
    rows = fp8._CPU_CHUNK_BYTES // (4 * h)
    g = torch.Generator().manual_seed(5)
    x = (torch.randn((2 * rows + 3, h), generator=g) * 10.0 ** torch.randint(
        -40, 30, (2 * rows + 3, h), generator=g)).to(dtype)   # three passes, the last short
    x[1, :128] = 0.0                     # a zero block: scale 1
    x[2, 128:] = -0.0
    x[3, 7] = float("nan")
    x[4, 9] = float("inf")
    x[rows, 200] = -float("inf")         # first row of the second pass
    x[rows + 1, :128] = torch.finfo(dtype).tiny / 4       # subnormals
    keep = x.clone()
    q, s = fp8.quantize(x)
    assert torch.equal(x.view(torch.uint8), keep.view(torch.uint8))   # x is not touched
    q1, s1 = _quantize_one_pass(x)
    assert torch.equal(q.view(torch.uint8), q1.view(torch.uint8))
    assert torch.equal(s.view(torch.int32), s1.view(torch.int32))


def test_low_latency_with_headroom_and_repeated_calls():
    def run(comm):
        out = [S.roundtrip(comm, [3, 5], seed=s, layouts=("low_latency",), m=8)
               for s in range(3)]          # three calls: both halves of the buffers, reused
        return out
    res = tilecomm.launch(run, 2, timeout=60)
    for s in range(3):
        S.check([res[0][s], res[1][s]], [3, 5], seed=s, m=8)


def test_a_token_sent_once_per_rank_however_many_of_its_experts():
    def run(comm):
        ep = ExpertParallel(comm, num_experts=4, hidden=8, dtype=torch.float32)
        x = torch.arange(16, dtype=torch.float32).reshape(2, 8) + 100 * comm.rank
        idx = torch.tensor([[0, 1], [2, 3]])           # token 0: both of rank 0's experts
        d = ep.dispatch(x, idx, torch.full((2, 2), 0.5))
        return d.src_rank.tolist(), d.src_token.tolist(), d.topk_idx.tolist(), \
            d.tokens_per_expert.tolist()
    r0, r1 = tilecomm.launch(run, 2, timeout=60)
    assert r0 == ([0, 1], [0, 0], [[0, 1], [0, 1]], [2, 2])
    assert r1 == ([0, 1], [1, 1], [[0, 1], [0, 1]], [2, 2])


def _bad_call(comm, what):
    ep = ExpertParallel(comm, num_experts=4, hidden=8, dtype=torch.float32)
    x = torch.ones((3, 8))
    idx = torch.tensor([[0, 1], [2, -1], [3, 0]])
    w = torch.ones((3, 2))
    kw = {}
    if comm.rank == 1:
        if what == "range":
            idx[2, 1] = 4
        elif what == "repeat":
            idx[1] = torch.tensor([2, 2])
        elif what == "k":
            idx, w = idx[:, :1].contiguous(), w[:, :1].contiguous()
        elif what == "dtype":
            x = x.to(torch.bfloat16)
    if what == "ll":
        kw = dict(mode="low_latency", max_tokens_per_rank=3 if comm.rank == 0 else 2)
    try:
        ep.dispatch(x, idx, w, **kw)
        got = None
    except Exception as e:              # noqa: BLE001 -- the test inspects it
        got = (type(e).__name__, str(e))
    # the layer stays usable after a refused call
    d = ep.dispatch(torch.ones((1, 8)), torch.tensor([[comm.rank * 2, -1]]), torch.ones((1, 2)))
    ok = ep.combine(d.x, d).tolist()
    return got, ok


@pytest.mark.parametrize("what,exc,text", [
    ("range", "ValueError", "token 2"),
    ("repeat", "ValueError", "token 1"),
    ("ll", "ValueError", "max_tokens_per_rank"),
    ("k", "CommMismatch", "K (topk columns)"),
    ("dtype", "TypeError", "dtype"),
])
def test_bad_input_raises_on_every_rank(what, exc, text):
    res = tilecomm.launch(_bad_call, 2, what, timeout=60)
    for rank, (got, ok) in enumerate(res):
        assert got is not None and got[0] == exc, (rank, got)
        assert text in got[1], (rank, got)
        assert ok == [[1.0] * 8]
    if exc == "ValueError":
        assert "rank 1" in res[0][0][1]


def test_ranks_disagreeing_at_construction():
    def run(comm):
        try:
            ExpertParallel(comm, num_experts=4, hidden=8 + comm.rank)
        except CommMismatch as e:
            return str(e)
    msgs = tilecomm.launch(run, 2, timeout=60)
    assert all("hidden" in m and "rank 1: 9" in m for m in msgs)

    def bad_e(comm):
        try:
            ExpertParallel(comm, num_experts=3, hidden=8)
        except ValueError as e:
            return str(e)
    assert all("multiple of the world size" in m for m in tilecomm.launch(bad_e, 2, timeout=60))


def test_combine_refuses_a_wrong_y_on_every_rank():
    def run(comm):
        ep = ExpertParallel(comm, num_experts=2, hidden=4, dtype=torch.float32)
        d = ep.dispatch(torch.ones((2, 4)), torch.tensor([[0, 1], [1, -1]]), torch.ones((2, 2)))
        y = d.x if comm.rank == 0 else d.x[:, :3]
        try:
            ep.combine(y, d)
        except Exception as e:      # noqa: BLE001
            return type(e).__name__, str(e)
    res = tilecomm.launch(run, 2, timeout=60)
    assert res[1][0] == "ValueError" and "expected" in res[1][1]
    assert res[0][0] == "ValueError" and "rank 1" in res[0][1]

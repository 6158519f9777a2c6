"""MoE dispatch/combine on the Triton kernel engine (tilecomm.moe.kernel) in the Triton
interpreter, one process per rank (``comm.use_cpu_kernels("triton")``, as
TILECOMM_CPU_KERNELS=triton): every layout bit for bit against the token-by-token reference
and against the CPU engine on the same inputs, and the error promises. Tiny rows: the
interpreter is slow. The sm_90 code generation of the kernels is checked in a subprocess
(moe_ptx.py) without the interpreter."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import tilecomm
from tilecomm.moe import ExpertParallel

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import moe_scenarios as S  # noqa: E402

pytestmark = pytest.mark.interpreter


def _engine_kind(comm):
    return comm.cpu_kernels


@pytest.mark.parametrize("tokens,dtype,h,e", [
    ([5, 3], torch.bfloat16, 32, 8),           # random bf16: exact bits
    ([4, 0, 6], torch.float32, 16, 6),         # random float32, a rank with no tokens
], ids=["w2-bf16", "w3-f32-empty-rank"])
def test_roundtrip_every_layout_matches_reference(rank_pool, tokens, dtype, h, e):
    # normal, grouped and low-latency in a row: six calls, both halves of each buffer
    g = rank_pool(len(tokens), "kernels")
    assert g.run(_engine_kind) == ["triton"] * len(tokens)
    res = g.run(S.roundtrip, tokens, 1, dtype, False, False,
                ("normal", "grouped", "low_latency"), None, e, h)
    S.check(res, tokens, seed=1, dtype=dtype, e=e, h=h)


def _same_as_cpu_engine(comm, tokens, dtype, h, e, fp8):
    """The kernel engine and the CPU engine on the same inputs: every output's bits."""
    from tilecomm.moe.cpu import CpuEngine
    x, idx, w = S.inputs(comm.rank, tokens[comm.rank], h=h, e=e, dtype=dtype, seed=7)
    outs = []
    for cpu in (False, True):
        ep = ExpertParallel(comm, num_experts=e, hidden=h, dtype=dtype)
        if cpu:                               # the same layer, the CPU engine in its place
            ep._engines["kernel"] = CpuEngine(comm)
        d = ep.dispatch(x, idx, w, fp8=fp8)
        y = S.normal_rows(d, comm.rank, dtype)
        out = ep.combine(y, d)
        outs.append([d.x, d.src_rank, d.src_token, d.topk_idx, d.topk_weights,
                     d.tokens_per_expert, out] + ([d.scales] if fp8 else []))
    return [torch.equal(S.bits(a), S.bits(b)) for a, b in zip(*outs)]


@pytest.mark.parametrize("w,dtype,h,fp8", [(3, torch.bfloat16, 16, False),
                                           (2, torch.bfloat16, 128, True)],
                         ids=["w3-bf16", "w2-fp8"])
def test_same_bits_as_the_cpu_engine(rank_pool, w, dtype, h, fp8):
    tokens = [6, 5, 7][:w]
    e = 6 if w == 3 else 4
    for same in rank_pool(w, "kernels").run(_same_as_cpu_engine, tokens, dtype, h, e, fp8):
        assert all(same), same


def test_fp8_rows_and_scales_every_layout(rank_pool):
    tokens = [4, 3]
    res = rank_pool(2, "kernels").run(S.roundtrip, tokens, 2, torch.bfloat16, False, True,
                       ("normal", "low_latency"), None, 4, 128)
    S.check(res, tokens, seed=2, fp8=True, e=4, h=128)


def _back_to_back(comm):
    """Two dispatches before either combine (halves: the first result survives the second
    call), then a larger call (the buffers grow) and a smaller one, low-latency included."""
    h, e = 16, 4
    ep = ExpertParallel(comm, num_experts=e, hidden=h, dtype=torch.float32)
    ins = [S.inputs(comm.rank, t, h=h, e=e, dtype=torch.float32, seed=s)
           for s, t in enumerate([3, 4, 9, 2])]
    d0 = ep.dispatch(*ins[0])
    keep = d0.x.clone()
    d1 = ep.dispatch(*ins[1])
    out1 = ep.combine(S.normal_rows(d1, comm.rank, torch.float32), d1)
    out0 = ep.combine(S.normal_rows(d0, comm.rank, torch.float32), d0)
    intact = torch.equal(S.bits(keep), S.bits(d0.x))
    d2 = ep.dispatch(*ins[2])                       # more rows: the receive buffer grows
    out2 = ep.combine(S.normal_rows(d2, comm.rank, torch.float32), d2)
    ll = S.roundtrip(comm, [2, 2], seed=3, dtype=torch.float32,
                     layouts=("low_latency", "low_latency"), m=3, e=e, h=h)
    return intact, [out0, out1, out2], ll


def test_back_to_back_calls_growth_and_low_latency(rank_pool):
    res = rank_pool(2, "kernels").run(_back_to_back)
    assert all(r[0] for r in res)
    from tilecomm.moe import reference as R
    for s, t in enumerate([3, 4, 9]):
        ins = [S.inputs(r, [t, t][r], h=16, e=4, dtype=torch.float32, seed=s) for r in range(2)]
        ref = R.dispatch([i[0] for i in ins], [i[1] for i in ins], [i[2] for i in ins], 4)
        ys = [R.weighted(lambda i, j, r=r, d=ref[r]: S.expert_output(
            d["x"][i:i + 1], d["topk_idx"][i, j:j + 1], r)[0], ref[r], torch.float32)
            for r in range(2)]
        want = R.combine(ys, ref, [t, t], torch.float32)
        for r in range(2):
            assert torch.equal(S.bits(res[r][1][s]), S.bits(want[r])), (s, r)
    S.check([r[2] for r in res], [2, 2], seed=3, dtype=torch.float32, m=3, e=4, h=16)


def test_gradients_through_the_kernel_engine(rank_pool):
    tokens = [5, 3]
    res = rank_pool(2, "kernels").run(S.grad_roundtrip, tokens, 4, "normal")
    S.check_grads(res, tokens, 4)


def _low_latency_steps(comm):
    """Decode steps on two layers of one shape: each layer's first low-latency call agrees
    on M with the peers (one host exchange), every later call talks to the host not at all
    (NOTE [low latency on the device]); the layers share the buffers."""
    layers = [ExpertParallel(comm, num_experts=4, hidden=16, dtype=torch.float32)
              for _ in range(2)]
    exchanges = []
    real = comm.exchange

    def spy(values):
        exchanges.append(list(values))
        return real(values)

    out, per_step = [], []
    comm.exchange = spy
    try:
        for s in range(3):
            for i, ep in enumerate(layers):
                x, idx, w = S.inputs(comm.rank, [3, 2][comm.rank], h=16, e=4,
                                     dtype=torch.float32, seed=10 + 2 * s + i)
                out.append({"low_latency": S.low_latency_step(comm, ep, x, idx, w, 4, False,
                                                              torch.float32)})
                per_step.append(len(exchanges))
    finally:
        comm.exchange = real
    return out, per_step


def test_low_latency_on_the_device_talks_to_the_host_once_per_layer(rank_pool):
    res = rank_pool(2, "kernels").run(_low_latency_steps)
    for r in range(2):
        assert res[r][1] == [1, 2, 2, 2, 2, 2], res[r][1]     # exchanges after each call
    for j in range(6):
        S.check([res[0][0][j], res[1][0][j]], [3, 2], seed=10 + j, dtype=torch.float32, m=4,
                e=4, h=16)


def _ll_refusal(comm, what):
    """Rank 1 makes a bad low-latency call; then both make a good one."""
    ep = ExpertParallel(comm, num_experts=4, hidden=16, dtype=torch.float32)
    x, idx, w = S.inputs(comm.rank, 3, h=16, k=2, e=4, dtype=torch.float32, seed=4)
    got = None
    try:
        if comm.rank == 1 and what == "tokens":
            ep.dispatch(torch.ones((5, 16)), idx.repeat(2, 1)[:5], w.repeat(2, 1)[:5],
                        mode="low_latency", max_tokens_per_rank=4)
        elif comm.rank == 1 and what == "range":
            bad = idx.clone()
            bad[1, 0] = 9
            ep.dispatch(x, bad, w, mode="low_latency", max_tokens_per_rank=4)
        elif comm.rank == 1 and what == "m":
            ep.dispatch(x, idx, w, mode="low_latency", max_tokens_per_rank=5)
        elif comm.rank == 1 and what == "k":
            ep.dispatch(x, idx[:, :1].contiguous(), w[:, :1].contiguous(), mode="low_latency",
                        max_tokens_per_rank=4)
        elif what == "m-later":
            S.low_latency_step(comm, ep, x, idx, w, 4, False, torch.float32)
            ep.dispatch(x, idx, w, mode="low_latency",
                        max_tokens_per_rank=5 if comm.rank == 1 else 4)
        else:
            ep.dispatch(x, idx, w, mode="low_latency", max_tokens_per_rank=4)
    except Exception as e:              # noqa: BLE001 -- the test inspects it
        got = (type(e).__name__, str(e))
    ok = S.roundtrip(comm, [3, 3], seed=4, dtype=torch.float32, layouts=("low_latency",),
                     m=4, e=4, h=16)
    return got, ok


@pytest.mark.parametrize("what,mine,peer", [
    ("tokens", "more tokens than max_tokens_per_rank", "rank 1 rejected its call"),
    ("range", "token 1", "rank 1 rejected its call"),
    ("m", "max_tokens_per_rank (fixed by a layer's first low-latency call): rank 0: 4, rank 1: 5",
     "rank 0: 4, rank 1: 5"),
    ("m-later", "max_tokens_per_rank 4 (fixed by its first one), got 5",
     "rank 1 rejected its call"),
    ("k", "K (topk columns): rank 0: 2, rank 1: 1", "K (topk columns): rank 0: 2, rank 1: 1"),
], ids=["tokens", "range", "m-first-call", "m-later", "k"])
def test_low_latency_bad_call_raises_on_every_rank_and_the_layer_goes_on(rank_pool, what,
                                                                         mine, peer):
    res = rank_pool(2, "kernels").run(_ll_refusal, what)
    assert res[1][0] is not None and mine in res[1][0][1], res[1][0]
    assert res[0][0] is not None and peer in res[0][0][1], res[0][0]
    S.check([res[0][1], res[1][1]], [3, 3], seed=4, dtype=torch.float32, m=4, e=4, h=16)


def _bad_call(comm, what):
    ep = ExpertParallel(comm, num_experts=4, hidden=8, dtype=torch.float32)
    x = torch.ones((3, 8))
    idx = torch.tensor([[0, 1], [2, -1], [3, 0]])
    w = torch.ones((3, 2))
    if comm.rank == 1:
        if what == "range":
            idx[2, 1] = 4
        elif what == "k":
            idx, w = idx[:, :1].contiguous(), w[:, :1].contiguous()
    try:
        d = ep.dispatch(x, idx, w)
        got = None
        if what == "y":                   # rank 1 hands combine a y of the wrong shape
            ep.combine(d.x if comm.rank == 0 else d.x[:, :3], d)
    except Exception as e:              # noqa: BLE001 -- the test inspects it
        got = (type(e).__name__, str(e))
    # the layer (and the engine's epochs) stay usable after a refused call
    d = ep.dispatch(torch.ones((1, 8)), torch.tensor([[comm.rank * 2, -1]]), torch.ones((1, 2)))
    ok = ep.combine(d.x, d).tolist()
    return got, ok


@pytest.mark.parametrize("what,exc,text", [("range", "ValueError", "token 2"),
                                           ("k", "CommMismatch", "K (topk columns)"),
                                           ("y", "ValueError", "y has the wrong shape")])
def test_bad_input_raises_on_every_rank(rank_pool, what, exc, text):
    res = rank_pool(2, "kernels").run(_bad_call, what)
    for rank, (got, ok) in enumerate(res):
        assert got is not None and got[0] == exc, (rank, got)
        assert text in got[1], (rank, got)
        assert ok == [[1.0] * 8]


@pytest.mark.slow
@pytest.mark.compile
def test_kernels_compile_for_sm90_with_release_acquire_and_vector_copies():
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    r = subprocess.run([sys.executable, str(HERE / "moe_ptx.py")], env=env,
                       capture_output=True, text=True, timeout=300)
    if r.returncode == 3:
        pytest.skip(r.stderr.strip())
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    res = json.loads([x for x in r.stdout.splitlines() if x.startswith("RESULT ")][-1][7:])
    for name in ("dispatch", "combine", "ll_dispatch", "ll_combine"):
        k = res[name]
        assert k["ordering"] == [], k     # the release after bar.sync, bar.sync after acquire
        assert k["release_sys"] >= 1, k   # signal_set: atom.release.sys
        assert k["acquire_sys"] >= 1, k   # wait_ge: ld.acquire.sys or fence.acquire.sys
        # the row copies of the full blocks: 128-bit loads and stores
        assert k["ld128"] >= 1 and k["st128"] >= 1, k
    assert res["sum"]["ordering"] == [] and res["sum"]["release_sys"] == 0, res["sum"]


def _silent_peer(comm):
    """Rank 1 passes the handshake but never pushes (its dispatch kernel is a no-op): rank 0's
    bounded device wait must give up and name the op, the peer and the epoch."""
    from tilecomm import CommTimeout
    os.environ["TRITON_INTERPRET"] = "1"      # a fresh launch, not the rank pool's ranks
    comm.use_cpu_kernels("triton")
    ep = ExpertParallel(comm, num_experts=4, hidden=16, dtype=torch.float32)
    x, idx, w = S.inputs(comm.rank, 4, h=16, k=2, e=4, dtype=torch.float32, drop=0.0)
    eng = ep.engine_for(x.device)
    eng.st.heap.timeout = 1.0                              # seconds a device wait polls
    if comm.rank == 1:
        class _Mute:                                       # launches nothing
            def __getitem__(self, grid):
                return lambda *a, **kw: None
        real = eng.st.k
        eng.st.k = type("K", (), {"moe_dispatch_push": _Mute(), "BLOCK_GPU": real.BLOCK_GPU})()
    try:
        ep.dispatch(x, idx, w)
    except CommTimeout as e:
        return str(e)
    return None


@pytest.mark.slow
def test_a_peer_that_never_pushes_is_a_bounded_commtimeout_naming_it():
    msgs = tilecomm.launch(_silent_peer, 2, timeout=60)
    assert msgs[1] is None                                 # the mute rank waits on nobody
    assert msgs[0] and "moe dispatch (epoch 1)" in msgs[0] and "for rank 1" in msgs[0], msgs


def _silent_peer_low_latency(comm):
    """Low-latency mode: after a good call, rank 1's next dispatch kernel launches nothing;
    rank 0's bounded device wait gives up naming the call and the peer."""
    from tilecomm import CommTimeout
    os.environ["TRITON_INTERPRET"] = "1"
    comm.use_cpu_kernels("triton")
    ep = ExpertParallel(comm, num_experts=4, hidden=16, dtype=torch.float32)
    x, idx, w = S.inputs(comm.rank, 3, h=16, k=2, e=4, dtype=torch.float32, drop=0.0)
    S.low_latency_step(comm, ep, x, idx, w, 4, False, torch.float32)
    eng = ep.engine_for(x.device)
    eng.st.heap.timeout = 1.0
    if comm.rank == 1:
        class _Mute:
            def __getitem__(self, grid):
                return lambda *a, **kw: None
        real = eng.st.k
        eng.st.k = type("K", (), {"moe_ll_dispatch_push": _Mute(),
                                  "BLOCK_GPU": real.BLOCK_GPU})()
    try:
        ep.dispatch(x, idx, w, mode="low_latency", max_tokens_per_rank=4)
    except CommTimeout as e:
        return str(e)
    return None


@pytest.mark.slow
def test_a_silent_peer_in_low_latency_mode_is_a_bounded_commtimeout_naming_it():
    msgs = tilecomm.launch(_silent_peer_low_latency, 2, timeout=60)
    assert msgs[1] is None
    assert msgs[0] and "moe low-latency dispatch (call 2)" in msgs[0] and "for rank 1" in \
        msgs[0], msgs


def _ll_bad_y(comm):
    """Every rank hands the device low-latency combine a bad y (shape, then dtype): the same
    checks and messages as normal mode, raised before any kernel; then the right y works."""
    ep = ExpertParallel(comm, num_experts=4, hidden=16, dtype=torch.float32)
    x, idx, w = S.inputs(comm.rank, 3, h=16, k=2, e=4, dtype=torch.float32, seed=5)
    d = ep.dispatch(x, idx, w, mode="low_latency", max_tokens_per_rank=4)
    got = []
    for y in (d.x[:, :3], d.x.to(torch.float64)):
        try:
            ep.combine(y, d)
        except (TypeError, ValueError) as e:
            got.append((type(e).__name__, str(e)))
    out = ep.combine(d.x, d)
    return got, out.shape


def test_low_latency_combine_checks_y_as_normal_mode(rank_pool):
    for got, shape in rank_pool(2, "kernels").run(_ll_bad_y):
        assert [g[0] for g in got] == ["ValueError", "TypeError"], got
        assert "y has the wrong shape" in got[0][1] and "y has the wrong dtype" in got[1][1]
        assert tuple(shape) == (3, 16)

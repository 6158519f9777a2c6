"""Training step: collectives and their exact bytes, bubble, memory accounting, overlap."""

import pytest

from tilecomm.workloads.layout import Layout
from tilecomm.workloads.models import ModelSpec
from tilecomm.workloads.training import train_step

# A small dense model: h=1024, 8 layers, 16 heads, 4 KV heads.
TINY = ModelSpec("tiny", layers=8, hidden=1024, heads=16, kv_heads=4, ffn=4096, vocab=32000)


def colls(r, par):
    return {c.collective: c for c in r.collectives if c.parallelism == par}


def test_tp_all_reduce_becomes_ag_rs_with_sp_same_bytes():
    kw = dict(global_batch=8, micro_batch=1, seq=2048)
    plain = train_step(TINY, "dgx-h100", 8, Layout(tp=8), **kw)
    sp = train_step(TINY, "dgx-h100", 8, Layout(tp=8, sp=True), **kw)
    ar = colls(plain, "tp")
    assert set(ar) == {"all_reduce"}
    assert ar["all_reduce"].nbytes == 2048 * 1024 * 2                  # T * h * bf16
    assert ar["all_reduce"].count == 4 * 8 * 8                        # 4/layer x 8 layers x 8 mb
    s = colls(sp, "tp")
    assert set(s) == {"all_gather", "reduce_scatter"}
    assert s["all_gather"].nbytes == s["reduce_scatter"].nbytes == 2048 * 1024 * 2
    assert s["all_gather"].count == ar["all_reduce"].count
    assert s["all_gather"].where == "8 ranks in 1 node"


def test_full_recompute_adds_a_forward_of_tp_traffic_and_compute():
    kw = dict(global_batch=8, micro_batch=1, seq=2048)
    a = train_step(TINY, "dgx-h100", 8, Layout(tp=8), **kw)
    b = train_step(TINY, "dgx-h100", 8, Layout(tp=8, recompute="full"), **kw)
    assert colls(b, "tp")["all_reduce"].count == 6 * 8 * 8
    # + one forward of the layers (not the output head): between 1.2x and 4/3 of the compute
    assert 1.2 < b.breakdown_s["compute"] / a.breakdown_s["compute"] < 4 / 3
    from tilecomm.workloads.compute import micro_batch
    from tilecomm.topology.gpus import GPUS
    mb = micro_batch(TINY, Layout(tp=8, recompute="full"), 2048, 2048, GPUS["H100"], 3350e9,
                     (8, 0))
    assert sum(mb.rec.values()) == pytest.approx(
        (b.breakdown_s["compute"] - a.breakdown_s["compute"]) / 8)
    assert b.memory["activations"] < a.memory["activations"]


def test_dp_collectives_by_zero_stage():
    kw = dict(global_batch=64, micro_batch=1, seq=2048)
    z0 = train_step(TINY, "dgx-h100", 16, Layout(tp=1, dp=16, zero=0), **kw)
    z1 = train_step(TINY, "dgx-h100", 16, Layout(tp=1, dp=16, zero=1), **kw)
    n = TINY.total_params()
    assert colls(z0, "dp")["all_reduce"].nbytes == 4 * n                 # fp32 gradients
    assert colls(z0, "dp")["all_reduce"].where == "16 ranks over 2 nodes (8/node)"
    assert colls(z1, "dp")["reduce_scatter"].nbytes == 4 * n
    assert colls(z1, "dp")["all_gather"].nbytes == 2 * n                 # bf16 weights
    # Memory: 18 bytes/param replicated vs 2 + 4 + 12/16 with the optimizer sharded.
    assert z0.memory["weights"] + z0.memory["gradients"] + z0.memory["optimizer"] == 18 * n
    assert z1.memory["optimizer"] == pytest.approx(12 * n / 16)
    z3 = train_step(TINY, "dgx-h100", 16, Layout(tp=1, dp=16, zero=3), **kw)
    assert z3.memory["gradients"] == pytest.approx(4 * n / 16)
    assert colls(z3, "dp")["all_gather"].count == 2 * 4                  # fwd+bwd x 4 mb


@pytest.mark.parametrize("pp, vpp, m", [(4, 1, 8), (4, 2, 8), (8, 1, 16), (2, 4, 8)])
def test_bubble_fraction(pp, vpp, m):
    r = train_step(TINY, "dgx-h100", 8 * pp, Layout(tp=8, pp=pp, vpp=vpp), global_batch=m,
                   micro_batch=1, seq=2048)
    assert r.micro_batches == m
    b = r.breakdown_s
    busy = b["compute"] + b["tp"] + b["cp"] + b["ep"]       # the per-micro-batch work
    assert b["bubble"] / busy == pytest.approx((pp - 1) / (vpp * m))


def test_moe_issues_dispatch_and_combine_over_ep_group():
    moe = ModelSpec("tinymoe", layers=4, hidden=1024, heads=16, kv_heads=4, ffn=2048,
                    vocab=32000, experts=8, top_k=2)
    r = train_step(moe, "dgx-h100", 16, Layout(tp=2, dp=8, ep=4, sp=True), global_batch=16,
                   micro_batch=1, seq=1024)
    ep = colls(r, "ep")
    d, c = ep["moe_dispatch"], ep["moe_combine"]
    # T/tp tokens, each sent once to every rank owning one of its 2 experts (2 of 8 per rank:
    # reached with 1 - C(6,2)/C(8,2) = 13/28), h * bf16 per row
    assert d.nbytes == pytest.approx(1024 / 2 * 4 * 13 / 28 * 1024 * 2)
    assert d.group == 4 and d.count == c.count == 2 * 4 * 2    # 2/layer x 4 layers x 2 mb
    assert r.breakdown_s["ep"] == pytest.approx(
        (d.total_us + c.total_us) * 1e-6)      # exposed (no ep_overlap)


def test_overlap_hides_dp_and_tp_overlap_reduces_exposed_tp():
    kw = dict(global_batch=32, micro_batch=1, seq=4096)
    L = Layout(tp=8, dp=4, sp=True, zero=1)
    on = train_step(TINY, "dgx-h100", 32, L, **kw)
    off = train_step(TINY, "dgx-h100", 32, L.with_(dp_overlap=False), **kw)
    assert off.breakdown_s["dp"] == pytest.approx(off.comm_total_s["dp"])
    assert on.breakdown_s["dp"] < off.breakdown_s["dp"]
    ov = train_step(TINY, "dgx-h100", 32, L.with_(tp_overlap=True), **kw)
    assert ov.breakdown_s["tp"] < on.breakdown_s["tp"]
    assert ov.step_s < on.step_s


def test_faster_fabric_shortens_exposed_dp():
    kw = dict(global_batch=64, micro_batch=1, seq=2048)
    L = Layout(tp=1, dp=64, zero=0, dp_overlap=False)
    a = train_step(TINY, "dgx-a100", 64, L, **kw)    # 200G NICs
    h = train_step(TINY, "dgx-h100", 64, L, **kw)    # 400G NICs
    assert h.breakdown_s["dp"] < 0.7 * a.breakdown_s["dp"]


def test_throughput_and_mfu_consistent():
    r = train_step("llama3-8b", "dgx-h100", 64, Layout(tp=2, dp=32, sp=True),
                   global_batch=256, micro_batch=1, seq=8192)
    assert r.tokens_per_s == pytest.approx(256 * 8192 / r.step_s)
    flops = 256 * 8192 * 3 * r_model_fwd()
    assert r.mfu == pytest.approx(flops / (r.step_s * 64 * 989e12))
    # below the best GEMM efficiency: attention, element-wise work and comm only add time
    from tilecomm.workloads.gemm import gemm_eff
    from tilecomm.topology.gpus import GPUS
    assert 0 < r.mfu < gemm_eff(1e9, 1e9, 1e9, GPUS["H100"])


def r_model_fwd():
    from tilecomm.workloads.models import PRESETS
    return PRESETS["llama3-8b"].fwd_flops_per_token(8192, causal=True)


def test_invalid_batch_message():
    with pytest.raises(ValueError, match="multiple of dp\\*micro_batch"):
        train_step(TINY, "dgx-h100", 16, Layout(tp=1, dp=16), global_batch=20)


def test_activation_memory_matches_korthikanti():
    """Korthikanti et al. 2022, sec. 4.1: 34sbh bytes/layer at tp=1 (GPT, dropout), 10sbh +
    24sbh/t with TP, 34sbh/t with TP+SP; flash attention removes the 5as^2b score term."""
    from tilecomm.workloads.models import PRESETS
    from tilecomm.workloads.training import activation_bytes_per_token_layer as act
    g = PRESETS["gpt3-175b"]                                   # h = 12288
    assert act(g, Layout()) == 34 * 12288                      # 417,792 B per token per layer
    assert act(g, Layout(tp=8)) == 10 * 12288 + 24 * 12288 / 8           # 159,744
    assert act(g, Layout(tp=8, sp=True)) == pytest.approx(34 * 12288 / 8)  # 52,224
    assert act(g, Layout(tp=8, sp=True, recompute="full")) == 2 * 12288 / 8
    # Llama-3 70B, TP8 + SP, no dropout: norms and GEMM inputs 8h/8, Q + out 2 x 8192/8,
    # one KV head pair 2 x 128, SwiGLU 3 x 28672/8; all x 2 bytes.
    ll = PRESETS["llama3-70b"]
    assert act(ll, Layout(tp=8, sp=True)) == 8 * 8192 / 8 + 2 * (1024 + 256 + 1024 + 3 * 3584)
    # DeepSeek-V3 MLA: the attention kernel saves the up-projected K (128 x 192) and V
    # (128 x 128), not the 576-wide latent; MoE layers keep 9 experts' SwiGLU tensors + 8 copies.
    ds = PRESETS["deepseek-v3"]
    rep = 4 * 7168 * 2 + (2 * (1536 + 512) + 64) * 2
    attn = (128 * 192 * 2 + 128 * 128 * 2) * 2
    moe = (9 * 3 * 2048 + 8 * 7168) * 2
    dense = 3 * 18432 * 2
    assert act(ds, Layout()) == pytest.approx(rep + attn + (3 * dense + 58 * moe) / 61)


def test_zero_memory_bytes_per_param():
    """Megatron-LM's mixed precision: bf16 weight 2 + fp32 grad 4 + fp32 master, m, v 12 = 18 B
    per parameter; ZeRO-1/2/3 shard the 12, then the 4, then the 2 over the DP group."""
    kw = dict(global_batch=16, micro_batch=1, seq=2048)
    n = TINY.total_params()                     # 8 x 12.6M + 2 x 32000 x 1024 + 1024
    assert n == 8 * (1024 * 1536 + 1024 * 1024 + 3 * 1024 * 4096 + 2048) + 65_536_000 + 1024
    for z, per in ((0, 18), (1, 2 + 4 + 12 / 16), (2, 2 + (4 + 12) / 16), (3, 18 / 16)):
        r = train_step(TINY, "dgx-h100", 16, Layout(dp=16, zero=z), **kw)
        states = r.memory["weights"] + r.memory["gradients"] + r.memory["optimizer"]
        extra = 2 * n / 8 if z == 3 else 0      # ZeRO-3: one layer's gathered weights
        assert states == pytest.approx(per * n + extra)


def test_cp_exchanges_kv_of_local_heads():
    """CP all_gather output = the whole sequence's K and V of this rank's heads, bf16."""
    r = train_step(TINY, "dgx-h100", 16, Layout(tp=2, cp=8), global_batch=2, micro_batch=1,
                   seq=16384)
    ag = colls(r, "cp")["all_gather"]
    assert ag.nbytes == 16384 * 2 * (4 // 2) * 64 * 2      # seq x (K,V) x 2 heads x 64 x 2 B
    assert ag.count == 2 * 8 * 2                           # fwd + bwd x 8 layers x 2 mb
    assert colls(r, "cp")["reduce_scatter"].count == 8 * 2


def test_routed_experts_cannot_beat_hbm():
    """Without EP each rank streams every expert's weights for few tokens: those GEMMs are
    HBM-bound (NOTE [what a layer computes]); EP cuts the weights read and the time."""
    from tilecomm.topology.gpus import GPUS
    from tilecomm.workloads.gemm import gemm_time
    moe = ModelSpec("finemoe", layers=4, hidden=2048, heads=16, kv_heads=4, ffn=1024,
                    vocab=32000, experts=64, top_k=2)
    kw = dict(global_batch=8, micro_batch=1, seq=1024)
    r1 = train_step(moe, "dgx-h100", 8, Layout(dp=8), **kw)
    r8 = train_step(moe, "dgx-h100", 8, Layout(dp=8, ep=8), **kw)
    # Hand count, gate+up of one expert without EP: 1024 x 2 / 64 = 32 rows against a
    # 2048 x 2048 bf16 weight: 8.4 MB read for 268 MFLOP, HBM-bound at 3350 x 0.8 GB/s.
    g = gemm_time(32, 2048, 2048, GPUS["H100"], 3350e9)
    assert g.hbm_bound
    assert g.seconds == pytest.approx(2 * (32 * 2048 * 2 + 2048 * 2048) / 2680e9)
    assert r1.compute_s["gemm_hbm"] > 2 * r8.compute_s["gemm_hbm"]
    assert r1.breakdown_s["compute"] > r8.breakdown_s["compute"]
    assert r1.compute_s["gemm_hbm"] > r1.compute_s["gemm"]


def test_ep_overlap_hides_all_to_all():
    moe = ModelSpec("tinymoe", layers=4, hidden=1024, heads=16, kv_heads=4, ffn=2048,
                    vocab=32000, experts=8, top_k=2)
    kw = dict(global_batch=16, micro_batch=1, seq=1024)
    L = Layout(tp=2, dp=8, ep=4, sp=True)
    a = train_step(moe, "dgx-h100", 16, L, **kw)
    b = train_step(moe, "dgx-h100", 16, L.with_(ep_overlap=True), **kw)
    assert b.comm_total_s["ep"] == a.comm_total_s["ep"] > 0
    assert b.breakdown_s["ep"] < a.breakdown_s["ep"] and b.step_s < a.step_s


def test_megatron_tflops_convention_is_eq3():
    """Narayanan et al. 2021 eq. 3: 96 B s l h^2 (1 + s/6h + V/16lh) FLOPs per iteration with
    full recompute (the head is not recomputed). GPT 1.7B, Table 1 row 1."""
    from tilecomm.workloads.validation import points
    p = points()[0]
    r = train_step(p.model, p.system, p.gpus, p.layout, p.global_batch, 1, p.seq)
    B, s, l, h, V = 512, 2048, 24, 2304, 51200
    eq3 = 96 * B * s * l * h * h * (1 + s / (6 * h) + V / (16 * l * h))
    got = r.hw_tflops_per_gpu * 1e12 * r.step_s * 32
    assert got == pytest.approx(eq3, rel=2e-3)      # the rest: biases and norms (13h/12h^2)


def test_the_most_loaded_stage_has_whole_moe_layers():
    """DeepSeek-V3 at PP4 printed 912.787 MoE dispatches per step (issue 34): the timed stage's
    16 layers were each 58/61 MoE. The stage holds whole layers, all MoE (the 3 dense layers fit
    on another stage), so every count is a whole number and the weights follow the same
    layers; at PP1 nothing changes (61 layers, 58 MoE)."""
    from tilecomm.workloads.inference import infer
    from tilecomm.workloads.models import PRESETS
    from tilecomm.workloads.training import stage_layers, stage_params

    ds = PRESETS["deepseek-v3"]
    assert stage_layers(ds, 4) == (16, 16) and stage_layers(ds, 1) == (61, 58)
    assert stage_layers(TINY, 3) == (3, 0)
    L = Layout(pp=4, dp=64, ep=8)
    r = train_step("deepseek-v3", "dgx-h100", 256, L, global_batch=1920)
    assert r.micro_batches == 30
    assert all(isinstance(c.count, int) for c in r.collectives), r.collectives
    assert colls(r, "ep")["moe_dispatch"].count == 2 * 16 * 30     # 2 passes x 16 layers x m
    _, expert = stage_params(ds, L)
    assert expert == 16 * ds.expert_params_per_layer() / 8
    _, expert1 = stage_params(ds, Layout(dp=8, ep=8))
    assert expert1 == 58 * ds.expert_params_per_layer() / 8
    d = infer("deepseek-v3", "dgx-h100", Layout(pp=4, dp=2, ep=2), 16, 128, 16, "decode")
    assert all(isinstance(c.count, int) for c in d.collectives), d.collectives
    assert {c.collective: c.count for c in d.collectives}["moe_dispatch"] == 16

"""A micro-batch's compute on one rank of the most loaded pipeline stage, GEMM by GEMM.

Units: seconds for times, bytes, elements for GEMM dimensions, tokens for ``T``.

NOTE [what a layer computes] (per rank, T tokens per micro-batch, tp = t)
    Every weight matmul is its own GEMM ``[M, K] x [K, N]`` timed by :mod:`.gemm` (shape-
    dependent efficiency, HBM roofline). Column-parallel GEMMs split N over TP, row-parallel
    ones split K; M = T (with SP the GEMM input is all-gathered first). Attention: QKV
    (GQA: at least one KV head per rank) and the output projection; MLA: the down-projections
    (replicated on every TP rank, as Megatron-LM runs them), the up-projections and the output.
    FFN: up (and gate, SwiGLU: N = 2 ffn/t) and down. An MoE layer: the router, the shared
    experts, and the routed experts as one grouped GEMM of experts/ep groups, each with
    ``T x top_k x ep / experts`` rows (uniform routing; DeepSeek-V3 at 4K tokens, no EP: 128
    rows against a 7168 x 4096 weight, HBM-bound). The output head (``T x h x V/t``) and the
    loss are charged 1/pp per stage, as the FLOPs always were. Backward: per GEMM a data
    gradient ``[M, N] x [N, K]`` and a weight gradient ``[K, M] x [M, N]`` accumulated into fp32
    (reduced over M: few rows make it slow); flash attention 2.5x its forward.

NOTE [element-wise work]
    Norms, residual adds, activations, RoPE, dropout masks, MoE token permutation, the loss
    over the vocabulary and FP8 casts are HBM-bound: bytes per token below, at HBM_EFF of the
    datasheet bandwidth, backward 2x the forward's bytes (it reads the saved input and the
    gradient, writes a gradient). ``kernels="fused"`` (Megatron-LM/Transformer Engine fused
    kernels, torch.compile): each op reads its inputs and writes its output once: norm 4 B per
    element of h, residual add 6, SwiGLU 6 per element of ffn (GELU 4), RoPE 4 per q/k element,
    dropout mask 1. ``kernels="eager"`` (PyTorch ops one by one, e.g. torchtitan or LLM Foundry
    without torch.compile): an RMSNorm in fp32 is 36 B per element (float(), pow, mean, rsqrt
    mul, cast back, weight mul), SwiGLU 10 (silu, then mul), complex RoPE 20, and the attention
    output's transpose copy 4; ATen's LayerNorm and GELU are single kernels (4 B). Parts that
    are replicated on TP ranks (norms, residuals) are split only with SP. The loss: 24 B per
    vocabulary logit fused (fp32 softmax and its gradient), 40 eager. FP8: 3 B per GEMM input
    element forward (read bf16, write fp8), 4 B per output-gradient element backward (plus a
    transposed copy), 1 B per input element for the weight gradient's transposed copy.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ..topology.gpus import GPU, HBM_EFF
from .gemm import ATTN_BWD, DERATE, attn_time, gemm_time
from .layout import Layout
from .models import ModelSpec

KERNELS = ("fused", "eager")
CATEGORIES = ("gemm", "gemm_hbm", "attention", "elementwise")
ACT = 2.0            # bf16 activation bytes


@dataclass
class MicroBatchCompute:
    """One micro-batch on one rank: seconds per category for forward, backward and recompute;
    ``gemm_flops`` / ``attn_flops`` of the forward (for the achieved efficiency)."""

    fwd: dict = field(default_factory=lambda: dict.fromkeys(CATEGORIES, 0.0))
    bwd: dict = field(default_factory=lambda: dict.fromkeys(CATEGORIES, 0.0))
    rec: dict = field(default_factory=lambda: dict.fromkeys(CATEGORIES, 0.0))
    gemm_flops: float = 0.0
    attn_flops: float = 0.0

    @property
    def t_fwd(self) -> float:
        return sum(self.fwd.values())

    @property
    def t_bwd(self) -> float:
        return sum(self.bwd.values())

    @property
    def total(self) -> float:
        return self.t_fwd + self.t_bwd + sum(self.rec.values())

    def part(self, *cats: str) -> float:
        """Forward + backward + recompute seconds of the given categories."""
        return sum(d[c] for d in (self.fwd, self.bwd, self.rec) for c in cats)


def layer_gemms(model: ModelSpec, L: Layout, T: float, moe: bool) -> list:
    """(M, N, K, groups) of one layer's forward GEMMs on one rank (NOTE [what a layer
    computes])."""
    h, t = model.hidden, L.tp
    out = []
    if model.mla:
        qd = model.heads * (model.hd + model.rope_head_dim)
        if model.q_lora_rank:
            out += [(T, model.q_lora_rank, h, 1), (T, qd / t, model.q_lora_rank, 1)]
        else:
            out.append((T, qd / t, h, 1))
        out += [(T, model.kv_lora_rank + model.rope_head_dim, h, 1),
                (T, model.heads * (model.hd + model.vd) / t, model.kv_lora_rank, 1)]
    else:
        kv = 2 * max(model.kv_heads / t, 1) * model.hd
        out.append((T, model.heads / t * model.hd + kv, h, 1))
    out.append((T, h, model.heads * model.vd / t, 1))
    up = 2 if model.gated_ffn else 1
    if not moe:
        return out + [(T, up * model.ffn / t, h, 1), (T, h, model.ffn / t, 1)]
    f = model.expert_ffn
    out.append((T / t if L.sp else T, model.experts, h, 1))            # router
    if model.shared_experts:
        fs = model.shared_experts * f
        out += [(T, up * fs / t, h, 1), (T, h, fs / t, 1)]
    rows = T * model.top_k * L.ep / model.experts
    g = model.experts / L.ep
    return out + [(rows, up * f / t, h, g), (rows, h, f / t, g)]


def elementwise_bytes(model: ModelSpec, L: Layout, moe: bool, kernels: str) -> float:
    """Forward bytes per token of one layer's element-wise work on one rank (NOTE
    [element-wise work])."""
    h, t = model.hidden, L.tp
    eager = kernels == "eager"
    rep = h / (t if L.sp else 1)
    norm = 4.0 if (model.bias or not eager) else 36.0
    b = 2 * norm * rep + 2 * 6 * rep
    if model.dropout:
        b += 2 * 1 * rep
    if not model.learned_positions:          # rotary embeddings on q and k
        qk = (model.heads / t + (0 if model.mla else max(model.kv_heads / t, 1))) * \
            (model.rope_head_dim or model.hd)
        b += (20.0 if eager else 4.0) * qk
    if eager:
        b += 4.0 * model.heads * model.vd / t
    act = (10.0 if eager else 6.0) if model.gated_ffn else 4.0
    if not moe:
        return b + act * model.ffn / t
    ffn = (model.top_k + model.shared_experts) * model.expert_ffn / t
    perm = 4.0 * (1 + model.top_k) * rep * (1.5 if eager else 1.0)
    return b + act * ffn + perm


def micro_batch(model: ModelSpec, L: Layout, T: float, seq: int, gpu: GPU, hbm_Bps: float,
                layers: tuple, dtype: str = "bf16", kernels: str = "fused",
                derate: float = DERATE) -> MicroBatchCompute:
    """Compute of one micro-batch of ``T`` tokens on one rank holding ``layers`` = (layers,
    MoE layers) of ``model``, context ``seq`` (NOTEs above)."""
    if kernels not in KERNELS:
        raise ValueError(f"kernels must be one of {', '.join(KERNELS)}, got {kernels!r}")
    ls, moe_ls = layers
    c = MicroBatchCompute()
    mem = hbm_Bps * HBM_EFF
    fp8 = dtype == "fp8"

    def add_gemm(m, n, k, g, count, dt=dtype):
        for d, (mm, nn, kk, ob) in (("fwd", (m, n, k, ACT)), ("bwd", (m, k, n, ACT)),
                                    ("bwd", (k, n, m, 8.0))):
            r = gemm_time(mm, nn, kk, gpu, hbm_Bps, dt, g, ob, derate)
            getattr(c, d)["gemm_hbm" if r.hbm_bound else "gemm"] += count * r.seconds
            if d == "fwd":
                c.gemm_flops += count * r.flops
        if dt == "fp8":     # casts: NOTE [element-wise work]
            c.fwd["elementwise"] += count * g * 3.0 * m * k / mem
            c.bwd["elementwise"] += count * g * (4.0 * m * n + 1.0 * m * k) / mem

    for moe, n in ((False, ls - moe_ls), (True, moe_ls)):
        if n <= 0:
            continue
        before = dict(c.fwd)
        for m, nn, k, g in layer_gemms(model, L, T, moe):
            add_gemm(m, nn, k, g, n)
        ew = n * T * elementwise_bytes(model, L, moe, kernels) / mem
        c.fwd["elementwise"] += ew
        c.bwd["elementwise"] += 2 * ew
        if L.recompute == "full":       # the layers' forward once more
            for k_ in CATEGORIES:
                c.rec[k_] += c.fwd[k_] - before[k_]
    # attention core (all this rank's layers; sliding-window layers in attn_flops_per_token)
    af = T * model.attn_flops_per_token(seq, causal=True) * ls / model.layers / L.tp
    hd = model.hd + (model.rope_head_dim if model.mla else 0)
    ta = attn_time(af, seq / L.cp, hd, gpu, derate)
    c.attn_flops = af
    c.fwd["attention"] += ta
    c.bwd["attention"] += ATTN_BWD * ta
    if L.recompute in ("selective", "full"):
        c.rec["attention"] += ta
    # output head and loss, 1/pp per stage (bf16 head: Megatron keeps it out of FP8)
    pp = L.pp
    add_gemm(T, model.vocab / L.tp, model.hidden, 1, 1 / pp, "fp16" if fp8 else dtype)
    loss = T * model.vocab / L.tp * (40.0 if kernels == "eager" else 24.0) / mem / pp
    c.fwd["elementwise"] += loss / 2
    c.bwd["elementwise"] += loss / 2
    return c


def optimizer_s(params: float, hbm_Bps: float) -> float:
    """Adam step over ``params`` locally owned parameters: reads fp32 gradient, master weight,
    m and v (16 B), writes master, m, v and the bf16 weight (14 B), HBM-bound."""
    return 30.0 * params / (hbm_Bps * HBM_EFF)

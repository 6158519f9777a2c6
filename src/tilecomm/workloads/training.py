"""One training step of a layout: collectives, compute, overlap, pipeline bubble, memory.

Units: seconds for times in results (``*_s``), microseconds for single collectives (``*_us``,
as in :mod:`tilecomm.sim`), bytes for sizes and memory, FLOP/s for rates.

NOTE [what a rank issues per micro-batch and per step] (Megatron-LM conventions)
    T = micro_batch * seq / cp tokens per rank per micro-batch, e = 2 bytes (bf16 activations).
    TP, per layer: 2 all_reduce forward + 2 backward (+2 in the recomputed forward with full
    recompute) of T*h*e; with SP each all_reduce becomes an all_gather + a reduce_scatter of
    the same buffer (Korthikanti et al. 2022). CP, per layer: all_gather of the K,V shards
    forward (and again in backward) and a reduce_scatter of their gradients (ring attention
    moves the same bytes). EP, per MoE layer: dispatch + combine all_to_all forward and
    backward, T/tp tokens per rank (tokens are split over TP ranks before routing), each sent
    once to every EP rank owning one of its top_k experts and across nodes once per node
    (tilecomm.sim.moe, expected traffic of uniform routing; rows of h*e bytes). PP, per
    micro-batch and model chunk: one activation forward and one gradient backward, T*h*e/tp
    (Megatron's scatter/gather split over the TP ranks). DP, per step: all_reduce of the fp32
    gradients (ZeRO 0), or reduce_scatter of them + all_gather of the bf16 weights (ZeRO 1/2);
    ZeRO 3 gathers the weights forward and backward and reduce-scatters gradients per
    micro-batch.

NOTE [overlap]
    Exposed = max(0, communication - the compute it can hide behind). DP gradient buckets hide
    behind one micro-batch's backward (frameworks reduce while the *last* micro-batch's
    backward runs) and ZeRO 1/2 weight gathers behind one forward, when ``dp_overlap``; ZeRO 3's
    per-micro-batch gathers behind that micro-batch's compute. TP hides behind the micro-batch's
    GEMMs only with ``tp_overlap``, as the fused ops' chunk pipeline allows
    (``tilecomm.sim.overlap.exposed_comm``: TP ranks' chunks arrive one step at a time, so
    up to one chunk's GEMM cannot hide anything); CP behind the attention core (ring attention overlaps its
    transfers with attention blocks). EP all_to_all is exposed (between the router and the
    experts that need its tokens) unless ``ep_overlap``, where it hides behind another
    micro-batch's compute (DeepSeek-V3's DualPipe, Megatron-core's overlapped MoE
    all-to-all). PP transfers are exposed.

NOTE [compute]
    Each micro-batch's compute is the sum of its GEMMs, each a roofline of its own shape
    (:mod:`.compute`, :mod:`.gemm`): few tokens per routed expert (DeepSeek-V3 at 4K tokens
    without EP: 128) make those GEMMs read their weights from HBM rather than compute, which
    is what makes EP pay for fine-grained MoE besides memory. Flash attention, element-wise
    work and the optimizer step (HBM-bound, once per step, not overlapped) have their own
    terms. ``StepResult.limiter`` names the largest term of the step.

NOTE [pipeline bubble]
    1F1B: (p-1) micro-batch slots of idle time per step, i.e. a fraction (p-1)/m of the ideal
    time; interleaved with v chunks per rank: (p-1)/v slots, fraction (p-1)/(v*m) (Narayanan
    et al. 2021, sec. 2.2). A slot is one micro-batch's forward+backward on one stage, including
    its exposed per-micro-batch communication.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field

from ..sim.overlap import exposed_comm
from .comm import Placement, collective_us, moe_us, p2p_us
from ..topology.gpus import GPU, gpu_of
from .compute import micro_batch as micro_batch_fn, optimizer_s
from .gemm import DERATE
from .layout import Layout, groups, validate
from .models import ModelSpec, load_model

ACT_BYTES = 2          # bf16 activations and activation gradients
WEIGHT_BYTES = 2       # bf16 weights (the copy the forward reads)
GRAD_BYTES = 4         # fp32 main gradients, reduced in fp32 (Megatron-LM's default for bf16)
OPTIM_BYTES = 12       # fp32 master weight + Adam m and v
RESERVE = 0.10         # HBM fraction kept for workspace, NCCL buffers, fragmentation (stated)
PARALLELISMS = ("tp", "cp", "ep", "pp", "dp")


@dataclass(frozen=True)
class Coll:
    """One kind of collective a rank issues: ``count`` per step of ``nbytes`` each."""

    parallelism: str
    collective: str
    nbytes: float
    group: int
    where: str
    count: int              # whole calls: the most loaded stage has whole layers
    time_us: float          # one call

    @property
    def total_us(self) -> float:
        return self.count * self.time_us


@dataclass
class StepResult:
    """A training step's prediction. Times in seconds, memory in bytes."""

    model: str
    system: str
    gpus: int
    layout: Layout
    global_batch: int
    micro_batch: int
    seq: int
    dtype: str
    micro_batches: int
    step_s: float
    breakdown_s: dict           # compute, tp, cp, ep, pp, dp (exposed), bubble
    comm_total_s: dict          # per parallelism, before overlap
    tokens_per_s: float
    tokens_per_s_per_gpu: float
    mfu: float                  # model FLOPs (3 x forward, causal attention) / peak
    hw_tflops_per_gpu: float    # Megatron-LM's convention: full s^2 attention + recompute
    memory: dict
    fits: bool
    collectives: list = field(default_factory=list)
    groups: dict = field(default_factory=dict)
    gpu: str = ""
    efficiency: float = 0.0     # achieved: forward FLOPs / (forward compute time x peak)
    layers: int = 0
    compute_s: dict = field(default_factory=dict)   # per step: gemm, gemm_hbm, attention, ...
    gpus_per_node: int = 0      # GPUs used per node (a rack may be partly used)
    kernels: str = "fused"

    @property
    def terms_s(self) -> dict:
        """Every term of the step, seconds: the compute parts and the exposed rest."""
        names = {"gemm": "compute: GEMM", "gemm_hbm": "compute: HBM-bound GEMMs (experts)",
                 "attention": "compute: attention", "elementwise": "compute: element-wise",
                 "optimizer": "optimizer step", "tp": "tp comm", "cp": "cp comm",
                 "ep": "ep comm", "pp": "pp comm", "dp": "dp comm exposed",
                 "bubble": "pp bubble"}
        out = {names[k]: v for k, v in self.compute_s.items() if k in names}
        for k in ("tp", "cp", "ep", "pp", "dp", "bubble"):
            out[names[k]] = self.breakdown_s.get(k, 0.0)
        return {k: v for k, v in out.items() if v > 0}

    @property
    def limiter(self) -> tuple[str, float]:
        """The term that takes the largest share of the step, and that share."""
        terms = self.terms_s
        k = max(terms, key=terms.get)
        return k, terms[k] / self.step_s

    def as_dict(self) -> dict:
        d = asdict(self)
        d["layout"] = self.layout.as_dict()
        d["collectives"] = [{**asdict(c), "total_us": c.total_us} for c in self.collectives]
        d["limiter"], d["limiter_share"] = self.limiter
        return d


def add_moe(colls: list, tokens: float, h: int, e: float, model: ModelSpec, system: str,
            pl: Placement, count: int, repeat: int = 1) -> float:
    """Record ``count`` MoE dispatches and as many combines over the EP group ``pl`` (``Coll``
    counts are ``count * repeat``: per step with ``repeat`` micro-batches); seconds they take
    (``count`` of each). ``nbytes``: what one rank sends in one dispatch (de-duplicated rows)."""
    if pl.size <= 1 or count <= 0 or tokens <= 0:
        return 0.0
    d, c, sent = moe_us(tokens, h, e, model.top_k, model.experts, system, pl)
    colls.append(Coll("ep", "moe_dispatch", sent, pl.size, pl.describe(), count * repeat, d))
    colls.append(Coll("ep", "moe_combine", sent, pl.size, pl.describe(), count * repeat, c))
    return count * (d + c) * 1e-6


def stage_embedding(model: ModelSpec, pp: int) -> float:
    """Embedding-side weights on the most loaded stage: all of them without PP; with PP the
    first stage holds the input embedding (+ positions) and the last the output head (a copy of
    the embedding when tied, as Megatron-LM does), so the larger of the two."""
    if pp == 1:
        return model.embedding_params()
    return model.vocab * model.hidden + model.learned_positions * model.hidden


def stage_layers(model: ModelSpec, pp: int) -> tuple[int, int]:
    """(layers, MoE layers) of the most loaded pipeline stage: ``ceil(layers / pp)`` layers, as
    many of them MoE as the model has. An MoE layer costs more than a dense one (routed experts,
    the EP all_to_all), and the leading dense layers (``dense_layers``) fit on another stage, so
    the stage that holds the most layers from the back is the slowest. Whole layers, so the
    collectives a rank issues per step are whole counts (the model's average mix of dense and
    MoE layers gave e.g. 16 x 58/61 = 15.2 MoE layers)."""
    ls = math.ceil(model.layers / pp)
    return ls, min(ls, model.moe_layers)


def stage_matmul_flops_per_token(model: ModelSpec, pp: int) -> float:
    """Forward weight-matmul FLOPs per token of the most loaded stage's layers (the output
    head not included): its layers at the model's average, plus what its MoE layers beyond
    the average mix add (2 x the active weights an MoE layer has over a dense one)."""
    ls, moe_ls = stage_layers(model, pp)
    avg = (model.matmul_flops_per_token() - 2.0 * model.vocab * model.hidden) / model.layers
    extra = moe_ls - ls * model.moe_layers / model.layers
    return ls * avg + extra * 2.0 * (model.moe_layer_params(active=True) -
                                     model.dense_layer_params())


def stage_params(model: ModelSpec, L: Layout) -> tuple[float, float]:
    """(dense, expert) weights held by one rank of the most loaded stage."""
    ls, moe_ls = stage_layers(model, L.pp)
    dense_part = ((ls - moe_ls) * model.dense_layer_params() +
                  moe_ls * (model.moe_layer_params() - model.expert_params_per_layer()))
    dense = (dense_part + stage_embedding(model, L.pp)) / L.tp
    expert = moe_ls * model.expert_params_per_layer() / (L.ep * L.tp)
    return dense, expert


def activation_bytes_per_token_layer(model: ModelSpec, L: Layout) -> float:
    """Stored activation bytes per token per layer on one rank, averaged over the dense and MoE
    layers of the most loaded stage (:func:`stage_layers`; Korthikanti et al. 2022, "Reducing Activation Recomputation", sec. 4.1, with flash
    attention: no s x s score, softmax or dropout-mask tensors, i.e. their 5as/h term is 0).

    Replicated on every TP rank unless SP splits them (their 10sbh for GPT): the two norm
    inputs (2 x 2h bytes), the norm outputs feeding the QKV and first FFN GEMMs (2h each), the
    two dropout masks (h bytes each, only if ``model.dropout``) and, for MLA, the compressed
    q/kv latents. Split over TP (their 24sbh/t for GPT): Q, K, V (GQA: at least one KV head per
    rank; MLA: the up-projected per-head K and V that the attention kernel saves), the attention
    output, and the FFN intermediates (GELU: 2 x ffn; SwiGLU: gate, up and their product, 3 x
    ffn), for MoE layers per routed + shared expert plus the dispatched token copies (top_k x h).
    GPT with dropout: 34h bytes at tp=1, 10h + 24h/t without SP, 34h/t with SP.
    Full recompute keeps only each layer's input: 2h bytes (/t with SP).
    """
    h, e, t = model.hidden, ACT_BYTES, L.tp
    sp = t if L.sp else 1
    if L.recompute == "full":
        return h * e / sp
    rep = 4 * h * e + (2 * h if model.dropout else 0)
    if model.mla:
        rep += (2 * (model.q_lora_rank + model.kv_lora_rank) + model.rope_head_dim) * e
        q = k = model.heads * (model.hd + model.rope_head_dim) / t
        v = model.heads * model.vd / t
    else:
        q = model.heads * model.hd / t
        k = v = model.hd * max(model.kv_heads / t, 1)
    out = model.heads * model.vd / t
    attn = (q + k + v + out) * e
    mats = 3 if model.gated_ffn else 2
    ls, moe_ls = stage_layers(model, L.pp)
    moe_frac = moe_ls / ls
    moe_mlp = ((model.top_k + model.shared_experts) * mats * model.expert_ffn +
               model.top_k * h) / t * e
    mlp = (1 - moe_frac) * mats * model.ffn / t * e + moe_frac * moe_mlp
    return rep / sp + attn + mlp


def memory(model: ModelSpec, L: Layout, micro_batch: int, seq: int, m: int, gpu: GPU) -> dict:
    """Bytes per GPU on the most loaded stage: weights, gradients, optimizer, activations."""
    dense, expert = stage_params(model, L)
    d, de = L.dp * L.cp, max(1, L.dp * L.cp // L.ep)
    w = WEIGHT_BYTES * (dense / d + expert / de if L.zero >= 3 else dense + expert)
    g = GRAD_BYTES * (dense / d + expert / de if L.zero >= 2 else dense + expert)
    o = OPTIM_BYTES * (dense / d + expert / de if L.zero >= 1 else dense + expert)
    if L.zero >= 3:   # one layer's gathered weights in flight
        w += WEIGHT_BYTES * (dense + expert) / math.ceil(model.layers / L.pp)
    tokens = micro_batch * seq / L.cp
    ls = math.ceil(model.layers / L.pp)
    per_mb = tokens * ls * activation_bytes_per_token_layer(model, L)
    inflight = min(m, L.pp) if L.pp > 1 else 1
    if L.vpp > 1:
        inflight *= 1 + (L.pp - 1) / (L.pp * L.vpp)
    act = per_mb * inflight
    if L.recompute == "full":   # one layer recomputed at a time with all its activations
        act += tokens * activation_bytes_per_token_layer(model, L.with_(recompute="none"))
    logits = tokens * model.vocab * 4 / L.tp     # fp32 logits for the loss (last stage)
    total = w + g + o + act + logits
    return {"weights": w, "gradients": g, "optimizer": o, "activations": act + logits,
            "total": total, "capacity": gpu.hbm_bytes, "usable": gpu.hbm_bytes * (1 - RESERVE)}


def node_size(gpus: int, gpus_per_node: int, requested: int | None = None) -> int:
    """GPUs used per node: ``requested`` if given (at most the node's), all of them when
    ``gpus`` fills whole nodes (or fits in one), else the largest multiple of 8 that divides
    ``gpus`` and fits a node: a rack-scale NVLink domain is filled partly in whole 8-GPU units
    (NVIDIA's GB200 NVL72 benchmarks use 64 of its 72 GPUs); an 8-GPU node is used whole.
    ValueError, with what would work, when none does."""
    if requested is not None:
        if isinstance(requested, bool) or not isinstance(requested, int) or requested < 1:
            raise ValueError(f"gpus_per_node must be a positive integer, got {requested!r}")
        if requested > gpus_per_node:
            raise ValueError(f"gpus_per_node={requested} exceeds the {gpus_per_node} GPUs of "
                             "one node")
        if gpus > requested and gpus % requested:
            raise ValueError(f"{gpus} GPUs is not a whole number of {requested}-GPU nodes")
        return requested
    if gpus <= gpus_per_node or gpus % gpus_per_node == 0:
        return gpus_per_node
    fits = [g for g in range(8, gpus_per_node, 8) if gpus % g == 0]
    if fits:
        return fits[-1]
    raise ValueError(f"{gpus} GPUs is not a whole number of {gpus_per_node}-GPU nodes"
                     + (", nor of nodes used in whole 8-GPU units; give the GPUs used per node "
                        "(--gpus-per-node)" if gpus_per_node > 8 else ""))


def train_step(model: str | ModelSpec, system: str, gpus: int, layout: Layout,
               global_batch: int, micro_batch: int = 1, seq: int = 4096,
               dtype: str = "bf16", gpus_per_node: int | None = None,
               kernels: str = "fused", derate: float = DERATE) -> StepResult:
    """Predict one training step of ``model`` on ``gpus`` GPUs of ``system`` with ``layout``.

    ``global_batch`` and ``micro_batch`` are in sequences of ``seq`` tokens.
    ``gpus_per_node``: GPUs used per node (default: :func:`node_size`; a GB200 NVL72 rack
    may be used 64 at a time). ``kernels``: "fused" (Megatron-LM / Transformer Engine,
    torch.compile) or "eager" element-wise kernels (NOTE [element-wise work] in
    :mod:`.compute`). ``derate``: fraction of the published matmul/attention rates a training
    step sustains (:mod:`.gemm`; the fitted default).
    """
    from .comm import spec_of
    model = load_model(model)
    spec = spec_of(system)
    gpu = gpu_of(spec)
    L = layout
    for k, v in (("global_batch", global_batch), ("micro_batch", micro_batch), ("seq", seq)):
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ValueError(f"{k} must be a positive integer, got {v!r}")
    gpn = node_size(gpus, spec.gpus_per_node, gpus_per_node)
    validate(L, model, gpus, gpn, seq)
    if model.is_moe and L.tp > 1 and not L.sp:
        raise ValueError("an MoE model with tp > 1 needs sequence parallelism (--sp), as "
                         "Megatron-LM requires")
    if global_batch % (L.dp * micro_batch):
        raise ValueError(f"global_batch={global_batch} must be a multiple of dp*micro_batch = "
                         f"{L.dp}*{micro_batch} = {L.dp * micro_batch}")
    m = global_batch // (L.dp * micro_batch)
    grp = groups(L, gpn)
    h, e = model.hidden, ACT_BYTES
    T = micro_batch * seq / L.cp                 # tokens per rank per micro-batch
    ls, moe_ls = stage_layers(model, L.pp)       # layers on the most loaded stage

    # -- compute (per micro-batch, one rank of the most loaded stage; NOTE [compute]) -------
    hbm = spec.mem_GBps * 1e9
    mb = micro_batch_fn(model, L, T, seq, gpu, hbm, (ls, moe_ls), dtype, kernels, derate)
    t_fwd, t_bwd = mb.t_fwd, mb.t_bwd
    t_comp_mb = mb.total
    dense_w, expert_w = stage_params(model, L)
    d_, de_ = L.dp * L.cp, max(1, L.dp * L.cp // L.ep)
    owned = dense_w / d_ + expert_w / de_ if L.zero >= 1 else dense_w + expert_w
    t_opt = optimizer_s(owned, hbm)

    # -- collectives -----------------------------------------------------------------------
    colls: list[Coll] = []

    def add(par, coll, nbytes, pl: Placement, count, per_mb=True):
        """Record ``count`` calls (per micro-batch, or per step); seconds they take."""
        if pl.size <= 1 or count <= 0 or nbytes <= 0:
            return 0.0
        t = collective_us(coll, nbytes, system, pl)
        colls.append(Coll(par, coll, nbytes, pl.size, pl.describe(),
                          count * (m if per_mb else 1), t))
        return count * t * 1e-6

    passes = 3 if L.recompute == "full" else 2   # forward-like passes carrying TP/EP comm
    # TP (per micro-batch)
    if L.sp:
        tp_s = (add("tp", "all_gather", T * h * e, grp.tp, 2 * passes * ls) +
                add("tp", "reduce_scatter", T * h * e, grp.tp, 2 * passes * ls))
    else:
        tp_s = add("tp", "all_reduce", T * h * e, grp.tp, 2 * passes * ls)
    # CP (per micro-batch)
    # K and V of this rank's heads (GQA: at least one KV head per rank; MLA: the up-projected
    # per-head K (nope + rope) and V the attention kernel exchanges, as Megatron-LM's MLA does).
    kv_tok = (model.heads / L.tp * (model.hd + model.rope_head_dim + model.vd) if model.mla
              else 2 * max(1, model.kv_heads // L.tp) * model.hd)
    kv = L.cp * T * kv_tok * e
    cp_s = (add("cp", "all_gather", kv, grp.cp, passes * ls) +
            add("cp", "reduce_scatter", kv, grp.cp, ls))
    # EP (per micro-batch)
    # EP (per micro-batch): one dispatch and one combine per pass (backward: the combine's
    # gradient is a dispatch and the dispatch's a combine), timed by tilecomm.sim.moe
    ep_s = add_moe(colls, T / L.tp, h, e, model, system, grp.ep, passes * moe_ls, m)
    # PP (per micro-batch)
    pp_s = 0.0
    if L.pp > 1:
        t = p2p_us(T * h * e / L.tp, system, grp.pp_cross_node)
        colls.append(Coll("pp", "send_recv", T * h * e / L.tp, 2,
                          "neighbour stages " + ("across nodes" if grp.pp_cross_node else
                                                 "in one node"), 2 * L.vpp * m, t))
        pp_s = 2 * L.vpp * t * 1e-6
    # DP
    dense, expert = stage_params(model, L)
    zero3_s = 0.0
    if L.zero >= 3:
        for pl, n in ((grp.dp, dense), (grp.edp, expert)):
            zero3_s += (add("dp", "all_gather", WEIGHT_BYTES * n, pl, 2) +
                        add("dp", "reduce_scatter", GRAD_BYTES * n, pl, 1))
        grad_s = gather_s = 0.0
    else:
        grad_s = gather_s = 0.0
        for pl, n in ((grp.dp, dense), (grp.edp, expert)):
            if L.zero == 0:
                grad_s += add("dp", "all_reduce", GRAD_BYTES * n, pl, 1, per_mb=False)
            else:
                grad_s += add("dp", "reduce_scatter", GRAD_BYTES * n, pl, 1, per_mb=False)
                gather_s += add("dp", "all_gather", WEIGHT_BYTES * n, pl, 1, per_mb=False)

    # -- overlap (NOTE [overlap]) -----------------------------------------------------------
    t_mm_mb = mb.part("gemm", "gemm_hbm")
    # fused all_gather_matmul / matmul_reduce_scatter: the chunk pipeline of
    # tilecomm.sim.overlap (the same calculation as `tilecomm sim overlap`)
    tp_x = exposed_comm(tp_s, t_mm_mb, L.tp) if L.tp_overlap else tp_s
    cp_x = max(0.0, cp_s - mb.part("attention"))
    z3_x = max(0.0, zero3_s - t_comp_mb)
    ep_x = max(0.0, ep_s - t_comp_mb) if L.ep_overlap else ep_s
    t_mb = t_comp_mb + tp_x + cp_x + ep_x + z3_x
    if L.dp_overlap:
        dp_x = max(0.0, grad_s - t_bwd) + max(0.0, gather_s - t_fwd)
    else:
        dp_x = grad_s + gather_s
    bubble = (L.pp - 1) / L.vpp * t_mb
    step = m * t_mb + m * pp_s + bubble + dp_x + t_opt
    brk = {"compute": m * t_comp_mb, "tp": m * tp_x, "cp": m * cp_x, "ep": m * ep_x,
           "pp": m * pp_s, "dp": dp_x + m * z3_x, "bubble": bubble, "optimizer": t_opt}
    comp = {k: m * mb.part(k) for k in ("gemm", "gemm_hbm", "attention", "elementwise")}
    comp["optimizer"] = t_opt
    peak = gpu.peak(dtype)
    achieved = ((mb.gemm_flops + mb.attn_flops) / (mb.t_fwd * peak)) if mb.t_fwd else 0.0
    comm_tot = {"tp": m * tp_s, "cp": m * cp_s, "ep": m * ep_s, "pp": m * pp_s,
                "dp": grad_s + gather_s + m * zero3_s}

    tokens = global_batch * seq
    # MFU counts what a causal model needs (3 x forward, half the s^2 attention products);
    # Megatron-LM's TFLOP/s (Narayanan et al. 2021, eq. 3) counts full s^2 attention and the
    # recomputed forward: both are reported so each published number meets its own convention.
    model_flops = tokens * 3 * model.fwd_flops_per_token(seq, causal=True)
    # Full recompute reruns every layer's forward, not the output head (eq. 3's 6hV term).
    head = 2.0 * model.vocab * h
    recomp = {"none": 0.0, "selective": model.attn_flops_per_token(seq),
              "full": model.fwd_flops_per_token(seq) - head}[L.recompute]
    hw_flops = tokens * (3 * model.fwd_flops_per_token(seq) + recomp)
    mem = memory(model, L, micro_batch, seq, m, gpu)
    return StepResult(
        model=model.name, system=spec.name, gpus=gpus, layout=L, global_batch=global_batch,
        micro_batch=micro_batch, seq=seq, dtype=dtype, micro_batches=m, step_s=step,
        breakdown_s=brk, comm_total_s=comm_tot, tokens_per_s=tokens / step,
        tokens_per_s_per_gpu=tokens / step / gpus,
        mfu=model_flops / (step * gpus * gpu.peak(dtype)),
        hw_tflops_per_gpu=hw_flops / (step * gpus) / 1e12, memory=mem,
        fits=mem["total"] <= mem["usable"], collectives=colls, groups=grp.as_dict(),
        gpu=gpu.name, efficiency=achieved, layers=model.layers, compute_s=comp,
        gpus_per_node=gpn, kernels=kernels)

"""Inference: prefill and decode for a layout (TP, PP, EP over data-parallel attention), and
disaggregated serving (KV cache moved from prefill ranks to decode ranks).

Units: seconds (``*_s``), bytes, tokens/s. A *replica* is ``tp*pp*dp`` GPUs serving ``batch``
concurrent requests; ``dp`` splits the batch (attention data parallelism, as used with EP).

NOTE [inference cost of one stage]
    time = max(compute, HBM traffic) + exposed collectives. Compute: the stage's FLOPs at the
    GPU's stated efficiency (topology/gpus.py). HBM: the stage's weights (MoE: only the experts the
    batch touches, expected count E*(1-(1-k/E)^tokens)) plus the KV cache read, at
    ``HBM_EFF`` of the datasheet bandwidth. Collectives (TP all_reduce 2 per layer, EP MoE
    dispatch + combine per MoE layer (tilecomm.sim.moe), one PP send per stage boundary) are
    on the critical path:
    inference frameworks do not overlap them with the dependent GEMMs by default.
    With pp > 1 the batch is cut into pp micro-batches that follow one another through the
    stages: per-token latency = pp stage times, throughput = batch / latency.

NOTE [serve: the KV transfer is the engine's schedule]
    A request's KV cache moves as tilecomm.kv moves it: each prefill rank holding a KV shard
    (min(tp, kv_heads) per stage; one per stage for MLA's replicated latent) pushes its heads'
    share of its stage's layers, one transfer per (layer, K/V, run of blocks), timed by
    tilecomm.kv.model on the system's NICs (NOTE [cost of a push] there). Every shard holder
    of a node is assumed to push at the same time (steady serving: all replicas hand off
    requests), so holders share the node's NICs when they outnumber them, as concurrent groups
    do in comm.py; a rank uses its own NIC. With a decode TP that splits heads finer, each
    sender makes one push per receiver (head_split); the decode node's NICs bound the time the
    same way (the larger of the two sides). Blocks of ``kv_block_size`` tokens (vLLM's default
    16); ``kv_run_blocks``: average contiguous run in blocks (None: contiguous on both sides).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field, replace

from .comm import Placement, collective_us, p2p_us
from ..topology.gpus import HBM_EFF, gpu_of
from .layout import Layout, groups, validate
from .models import ModelSpec, load_model
from .training import (ACT_BYTES, RESERVE, Coll, add_moe, stage_layers,
                       stage_matmul_flops_per_token, stage_params)

WEIGHT_BYTES = {"bf16": 2, "fp16": 2, "fp8": 1}


@dataclass
class InferResult:
    """Prefill (``latency_s`` = time to first token) or decode (``latency_s`` = per token)."""

    mode: str
    model: str
    system: str
    gpus: int
    layout: Layout
    batch: int
    prompt: int
    context: int
    dtype: str
    latency_s: float
    tokens_per_s: float
    tokens_per_s_per_gpu: float
    breakdown_s: dict          # per-token (decode) or per-prompt (prefill) critical path
    memory: dict
    fits: bool
    kv_bytes_per_request: float
    kv_transfer_s: float = 0.0  # serve: prefill -> decode ranks, one request
    kv_transfers_per_request: int = 0  # serve: contiguous moves, all senders together
    collectives: list = field(default_factory=list)
    groups: dict = field(default_factory=dict)

    def as_dict(self) -> dict:
        d = asdict(self)
        d["layout"] = self.layout.as_dict()
        d["collectives"] = [{**asdict(c), "total_us": c.total_us} for c in self.collectives]
        return d


def _weights_local(model: ModelSpec, L: Layout, tokens: float) -> tuple[float, float]:
    """(held, read per step) weights on one rank of the most loaded stage, in parameters."""
    dense, _ = stage_params(model, L)
    if not model.is_moe:
        return dense, dense
    _, moe_ls = stage_layers(model, L.pp)
    e_local = model.experts / L.ep
    held_e = moe_ls * e_local * model.mlp_params(model.expert_ffn) / L.tp
    # Tokens routed to this rank's experts: every EP rank sees the whole EP group's tokens.
    routed = tokens * L.ep
    touched = e_local * (1 - (1 - model.top_k / model.experts) ** routed)
    read_e = moe_ls * touched * model.mlp_params(model.expert_ffn) / L.tp
    return dense + held_e, dense + read_e


def _kv_transfer(model: ModelSpec, spec, pre: Layout, dec: Layout, prompt: int,
                 block_size: int, run_blocks: float | None) -> tuple[float, int]:
    """(seconds, transfers) of one request's KV cache, prefill -> decode ranks
    (NOTE [serve: the KV transfer is the engine's schedule])."""
    import torch

    from tilecomm.kv.model import KVLink, block_layout, push_time
    from tilecomm.kv.schedule import CacheGeometry, coalesce, transfers
    if isinstance(block_size, bool) or not isinstance(block_size, int) or block_size < 1:
        raise ValueError(f"kv_block_size must be an int >= 1, got {block_size!r}")
    if not (spec.gpus_per_node and spec.nics_per_node):
        return 0.0, 0
    if model.mla:       # the latent as K and V halves of one head: the engine's [L, 2, ...] cache
        heads, head_dim = 1, math.ceil((model.kv_lora_rank + model.rope_head_dim) / 2)
    else:
        heads, head_dim = model.kv_heads, model.hd

    def shards(x: Layout) -> int:
        return 1 if model.mla else min(x.tp, model.kv_heads)

    push_heads = max(1, heads // max(shards(pre), shards(dec)))   # heads of one push
    nblocks = math.ceil(prompt / block_size)
    src, dst = block_layout(nblocks, run_blocks)
    link = KVLink.from_system(spec)
    sides = []
    for x in (pre, dec):                     # the senders' nodes, then the receivers'
        layers = math.ceil(model.layers / x.pp)                   # the most loaded stage
        geo = CacheGeometry(layers, nblocks, block_size, push_heads, head_dim,
                            torch.bfloat16)                       # ACT_BYTES = 2
        holders = max(1, min(x.gpus, spec.gpus_per_node) * shards(x) // x.tp)  # per node
        pushes = holders * max(1, heads // shards(x) // push_heads)
        nics = min(spec.nics_per_node, holders)                   # a rank uses its own NIC
        sides.append(push_time(geo, src, dst, replace(link, nics=nics), pushes=pushes).seconds)
    n = (heads // push_heads) * len(transfers(coalesce(src, dst), range(model.layers)))
    return max(sides), n


def infer(model: str | ModelSpec, system: str, layout: Layout, batch: int,
          prompt: int = 2048, gen: int = 256, mode: str = "decode", dtype: str = "bf16",
          decode_layout: Layout | None = None, kv_block_size: int = 16,
          kv_run_blocks: float | None = None) -> InferResult:
    """Predict ``mode`` ('prefill' | 'decode' | 'serve') for ``batch`` requests of ``prompt``
    tokens generating ``gen`` (decode is timed at the mean context, prompt + gen/2).

    'serve' = disaggregated: prefill on ``layout``, decode on ``decode_layout`` (default: the
    same shape) in other nodes; adds the KV-cache transfer of one request between them, timed
    from the engine's schedule (NOTE [serve: the KV transfer is the engine's schedule]):
    blocks of ``kv_block_size`` tokens, contiguous runs of ``kv_run_blocks`` blocks on average
    (None: one run).
    """
    from .comm import spec_of
    if mode not in ("prefill", "decode", "serve"):
        raise ValueError(f"mode must be prefill, decode or serve, got {mode!r}")
    for k, v, lo in (("batch", batch, 1), ("prompt", prompt, 1), ("gen", gen, 0)):
        if isinstance(v, bool) or not isinstance(v, int) or v < lo:
            raise ValueError(f"{k} must be an integer >= {lo}, got {v!r}")
    model = load_model(model)
    spec = spec_of(system)
    gpu = gpu_of(spec)
    L = layout
    if L.cp != 1:
        raise ValueError("context parallelism is modeled for training only; use cp=1")
    validate(L, model, L.gpus, spec.gpus_per_node)
    if batch < 1 or batch % (L.dp * L.pp):
        raise ValueError(f"batch={batch} must be a positive multiple of dp*pp = {L.dp * L.pp} "
                         "(dp splits the batch, pp pipelines pp micro-batches)")
    if dtype not in WEIGHT_BYTES:
        raise ValueError(f"dtype must be one of {', '.join(WEIGHT_BYTES)}, got {dtype!r}")
    if mode == "serve":
        pre = infer(model, system, L, batch, prompt, gen, "prefill", dtype)
        dec = infer(model, system, decode_layout or L, batch, prompt, gen, "decode", dtype)
        t_kv, n_kv = _kv_transfer(model, spec, L, decode_layout or L, prompt, kv_block_size,
                                  kv_run_blocks)
        dec.mode, dec.kv_transfer_s, dec.kv_transfers_per_request = "serve", t_kv, n_kv
        dec.breakdown_s = {"prefill_ttft": pre.latency_s, "kv_transfer": t_kv,
                           **{f"decode_{k}": v for k, v in dec.breakdown_s.items()}}
        dec.collectives = ([replace(c, parallelism=f"prefill {c.parallelism}")
                            for c in pre.collectives] +
                           [replace(c, parallelism=f"decode {c.parallelism}")
                            for c in dec.collectives])
        return dec

    grp = groups(L, spec.gpus_per_node)
    b = batch / (L.dp * L.pp)                        # sequences per micro-batch per DP rank
    tokens = b * (prompt if mode == "prefill" else 1)
    context = prompt if mode == "prefill" else prompt + gen // 2
    ls, moe_ls = stage_layers(model, L.pp)
    h, e = model.hidden, ACT_BYTES
    wb = WEIGHT_BYTES[dtype]
    # compute
    head = 2.0 * model.vocab * h
    mm = tokens * (stage_matmul_flops_per_token(model, L.pp) + head / L.pp) / L.tp
    attn_tok = model.attn_flops_per_token(context, causal=(mode == "prefill"))
    attn = tokens * attn_tok * ls / model.layers / L.tp
    t_comp = mm / (gpu.peak(dtype) * gpu.efficiency) + attn / (gpu.peak("bf16") * gpu.efficiency)
    # HBM traffic
    held, read = _weights_local(model, L, tokens)
    kv_div = 1 if model.mla else min(L.tp, model.kv_heads)
    kv_tok_stage = model.kv_bytes_per_token(e) * ls / model.layers / kv_div
    kv_read = b * context * kv_tok_stage
    t_mem = (read * wb + kv_read) / (spec.mem_GBps * 1e9 * HBM_EFF)
    # collectives (one stage, one micro-batch)
    colls: list[Coll] = []

    def add(par, coll, nbytes, pl: Placement, count):
        if pl.size <= 1 or count <= 0:
            return 0.0
        t = collective_us(coll, nbytes, system, pl)
        colls.append(Coll(par, coll, nbytes, pl.size, pl.describe(), count, t))
        return count * t * 1e-6

    tp_s = add("tp", "all_reduce", tokens * h * e, grp.tp, 2 * ls)
    # one MoE dispatch + one combine per MoE layer (tilecomm.sim.moe, normal mode)
    ep_s = add_moe(colls, tokens / L.tp, h, e, model, system, grp.ep, moe_ls)
    pp_s = 0.0
    if L.pp > 1:
        t = p2p_us(tokens * h * e, system, grp.pp_cross_node)
        colls.append(Coll("pp", "send_recv", tokens * h * e, 2, "neighbour stages", 1, t))
        pp_s = t * 1e-6
    stage = max(t_comp, t_mem) + tp_s + ep_s + pp_s
    latency = L.pp * stage
    produced = batch * (prompt if mode == "prefill" else 1)
    # memory: weights + KV cache of every request held by this rank
    kv_cache = (batch / L.dp) * (prompt + gen) * kv_tok_stage
    act = tokens * h * e * 4 if mode == "prefill" else 0.0
    mem = {"weights": held * wb, "kv_cache": kv_cache, "activations": act,
           "total": held * wb + kv_cache + act, "capacity": gpu.hbm_bytes,
           "usable": gpu.hbm_bytes * (1 - RESERVE)}
    brk = {"compute" if t_comp >= t_mem else "hbm": L.pp * max(t_comp, t_mem),
           "tp": L.pp * tp_s, "ep": L.pp * ep_s, "pp": L.pp * pp_s}
    return InferResult(
        mode=mode, model=model.name, system=spec.name, gpus=L.gpus, layout=L, batch=batch,
        prompt=prompt, context=context, dtype=dtype, latency_s=latency,
        tokens_per_s=produced / latency, tokens_per_s_per_gpu=produced / latency / L.gpus,
        breakdown_s=brk, memory=mem, fits=mem["total"] <= mem["usable"],
        kv_bytes_per_request=prompt * model.kv_bytes_per_token(e), collectives=colls,
        groups=grp.as_dict())

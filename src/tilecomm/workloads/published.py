"""Published training throughputs, each described from its published config.

Two sets, fixed by source before any error was looked at (NOTE [fitting and held-out sets]):

* FITTING (``held_out=False``): the points the project carried before the compute side followed
  GEMM shapes: Narayanan et al. 2021 Table 1 (GPT on A100) and Dubey et al. 2024 Table 4
  (Llama 3 405B on H100), in TFLOP/s per GPU. Only these choose ``gemm.DERATE``.
* HELD OUT (``held_out=True``): every other source, in tokens/s per GPU; never used in a fit.

NOTE [fitting and held-out sets]
    The split is by source: a parameter fitted on one publisher's runs is judged on the others'.
    Held-out sources: Megatron-Bridge 25.11 performance summary (NVIDIA; GB200, B200, H100;
    dense and MoE; BF16 and FP8), NeMo 24.07 performance summary (NVIDIA; H100 FP8), torchtitan's
    benchmarks (PyTorch; FSDP, 2D, 3D on H100 and A100), LLM Foundry's MPT benchmark tables
    (MosaicML; FSDP on A100 and H100) and the DeepSeek-V3 report (H800 FP8). Rows a layout
    cannot express are left out and listed in ``EXCLUDED``; rows were not chosen by error.

Assumptions where the sources are silent are stated next to each source's rows.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from .layout import Layout
from .models import PRESETS, ModelSpec

MEGATRON = "Narayanan et al. 2021 (arXiv 2104.04473) Table 1"
LLAMA3 = "Dubey et al. 2024 (arXiv 2407.21783) Table 4"
BRIDGE = "Megatron-Bridge 25.11 performance summary"
NEMO = "NeMo 24.07 performance summary"
TITAN = "torchtitan benchmarks (H100, 2024-12)"
TITAN_A100 = "torchtitan docs/performance.md (A100)"
FOUNDRY = "LLM Foundry MPT benchmarks"
DSV3 = "DeepSeek-V3 report (arXiv 2412.19437)"

SOURCES = {
    MEGATRON: "Narayanan et al. 2021, Efficient Large-Scale Language Model Training on GPU "
              "Clusters Using Megatron-LM, Table 1 (achieved TFLOP/s per GPU, eq. 3)",
    LLAMA3: "Dubey et al. 2024, The Llama 3 Herd of Models, Table 4 (TFLOPs/GPU = BF16 MFU)",
    BRIDGE: "github.com/NVIDIA-NeMo/Megatron-Bridge docs/performance-summary.md, 25.11 "
            "container (DGX-GB200, DGX-B200, DGX-H100 tables)",
    NEMO: "github.com/NVIDIA/NeMo docs/source/performance/performance_summary.md, NeMo 24.07, "
          "DGX-H100, FP8",
    TITAN: "github.com/pytorch/torchtitan benchmarks/llama3_h100_202412_torchtitan.md",
    TITAN_A100: "github.com/pytorch/torchtitan docs/performance.md (64 A100 80GB, FSDP2)",
    FOUNDRY: "github.com/mosaicml/llm-foundry scripts/train/benchmarking/README.md",
    DSV3: "DeepSeek-AI 2024, DeepSeek-V3 Technical Report, sec. 1 and 3: 180K H800 GPU hours "
          "per trillion tokens on 2048 H800 = 1e12 / (180e3 x 3600) = 1,543 tokens/s per GPU",
}

GRAND_TETON = str(Path(__file__).resolve().parent / "systems" / "grand-teton-h100.json")


@dataclass(frozen=True)
class Point:
    """One published run. ``published`` is in ``metric``: "tokens" (tokens/s per GPU),
    "megatron" (TFLOP/s per GPU, eq. 3 of Narayanan et al.) or "mfu" (MFU x BF16 peak)."""

    source: str
    label: str
    model: ModelSpec
    system: str
    gpus: int
    layout: Layout
    global_batch: int
    seq: int
    published: float
    metric: str = "tokens"
    micro_batch: int = 1
    dtype: str = "bf16"
    kernels: str = "fused"
    held_out: bool = True


def _gpt(params: str, heads: int, hidden: int, layers: int) -> ModelSpec:
    return ModelSpec(f"gpt-{params}", layers, hidden, heads, heads, 4 * hidden, 51200,
                     gated_ffn=False, tied_embeddings=True, bias=True, learned_positions=2048,
                     dropout=True, source=MEGATRON)


def _mpt(size: str, layers: int, hidden: int, heads: int, seq: int) -> ModelSpec:
    # MPT as benchmarked: GELU FFN 4h, biases and LayerNorm biases, tied embeddings, learned
    # positions (the tables' NumParams grow with the sequence by seq x h: 6,658,859,008 for 7b
    # at 2048 is exactly this description), vocabulary 50,368.
    return ModelSpec(f"mpt-{size}", layers, hidden, heads, heads, 4 * hidden, 50368,
                     gated_ffn=False, tied_embeddings=True, bias=True, learned_positions=seq,
                     source=FOUNDRY)


# -- fitting set -------------------------------------------------------------------------------
# (params, heads, hidden, layers, TP, PP, GPUs, batch, achieved TFLOP/s per GPU): Table 1.
_MEGATRON_ROWS = [
    ("1.7B", 24, 2304, 24, 1, 1, 32, 512, 137), ("3.6B", 32, 3072, 30, 2, 1, 64, 512, 138),
    ("7.5B", 32, 4096, 36, 4, 1, 128, 512, 142), ("18.4B", 48, 6144, 40, 8, 1, 256, 1024, 135),
    ("39.1B", 64, 8192, 48, 8, 2, 512, 1536, 138),
    ("76.1B", 80, 10240, 60, 8, 4, 1024, 1792, 140),
    ("145.6B", 96, 12288, 80, 8, 8, 1536, 2304, 148),
    ("310.1B", 128, 16384, 96, 8, 16, 1920, 2160, 155),
    ("529.6B", 128, 20480, 105, 8, 35, 2520, 2520, 163),
    ("1008B", 160, 25600, 128, 8, 64, 3072, 3072, 163),
]
# Assumptions for Table 1: micro-batch 1, plain 1F1B, full recomputation (eq. 3 counts it), no
# SP (it postdates the paper), gradients all-reduced after the backward pass, no ZeRO.
# (GPUs, CP, DP, seq, sequences per DP rank, TFLOPs/GPU): Table 4, TP 8 and PP 16 throughout.
_LLAMA3_ROWS = [(8192, 1, 64, 8192, 32, 430), (16384, 1, 128, 8192, 16, 400),
                (16384, 16, 8, 131072, 16, 380)]
# Assumptions for Table 4: SP on, interleaved v = 4, micro-batch 1, ZeRO-1, gradient reduction
# overlapped, no recomputation; dgx-h100's 400G fat tree stands in for Meta's RoCE fabric.


def fitting() -> list[Point]:
    out = []
    for name, a, h, nl, tp, pp, g, b, pub in _MEGATRON_ROWS:
        L = Layout(tp=tp, pp=pp, dp=g // (tp * pp), recompute="full", zero=0,
                   dp_overlap=False)
        out.append(Point(MEGATRON, f"GPT {name}, {g} A100, TP{tp} PP{pp}", _gpt(name, a, h, nl),
                         "dgx-a100", g, L, b, 2048, pub, "megatron", held_out=False))
    for g, cp, dp, seq, bpd, pub in _LLAMA3_ROWS:
        L = Layout(tp=8, pp=16, dp=dp, cp=cp, vpp=4, sp=True, zero=1)
        out.append(Point(LLAMA3, f"Llama 3 405B, {g} H100, TP8 CP{cp} PP16 DP{dp}, seq {seq}",
                         PRESETS["llama3-405b"], "dgx-h100", g, L, dp * bpd, seq, pub, "mfu",
                         held_out=False))
    return out


# -- held out ----------------------------------------------------------------------------------
_SYS = {"GB200": "gb200-nvl72", "B200": "dgx-b200", "H100": "dgx-h100"}
_BRIDGE_MODELS = {"LLAMA3_8B": "llama3-8b", "LLAMA3_70B": "llama3-70b",
                  "LLAMA3.1_405B": "llama3-405b", "DeepSeekV3": "deepseek-v3",
                  "GPT OSS 120B": "gpt-oss-120b", "Qwen3_30B_a3B": "qwen3-30b-a3b",
                  "Qwen3_235B_a22B": "qwen3-235b-a22b"}
# (system, model, GPUs, precision, GBS, MBS, seq, FSDP, TP, PP, CP, VP, EP, tokens/s/GPU)
_BRIDGE_ROWS = [
    ("GB200", "LLAMA3_8B", 8, "fp8", 128, 2, 8192, 0, 1, 1, 1, 1, 1, 31508),
    ("GB200", "LLAMA3_70B", 64, "fp8", 256, 2, 8192, 1, 1, 1, 1, 1, 1, 4312),
    ("GB200", "LLAMA3.1_405B", 256, "fp8", 1536, 1, 8192, 0, 4, 16, 1, 4, 1, 813),
    ("GB200", "DeepSeekV3", 256, "bf16", 4096, 1, 4096, 0, 1, 4, 1, 4, 64, 3139),
    ("GB200", "DeepSeekV3", 256, "fp8", 4096, 1, 4096, 0, 1, 8, 1, 4, 32, 4018),
    ("GB200", "GPT OSS 120B", 64, "bf16", 1280, 1, 8192, 0, 1, 1, 1, 1, 64, 15876),
    ("GB200", "Qwen3_30B_a3B", 8, "fp8", 512, 4, 4096, 0, 1, 1, 1, 1, 8, 23766),
    ("GB200", "Qwen3_235B_a22B", 256, "bf16", 8192, 1, 4096, 0, 1, 8, 1, 3, 32, 4916),
    ("B200", "LLAMA3_8B", 8, "fp8", 128, 2, 8192, 0, 1, 1, 1, 1, 1, 30624),
    ("B200", "LLAMA3.1_405B", 128, "fp8", 64, 1, 8192, 0, 4, 8, 2, 8, 1, 661),
    ("B200", "DeepSeekV3", 256, "fp8", 2048, 1, 4096, 0, 1, 16, 1, 1, 8, 2139),
    ("B200", "GPT OSS 120B", 64, "bf16", 512, 4, 4096, 0, 1, 1, 1, 1, 8, 8213),
    ("B200", "Qwen3_30B_a3B", 8, "fp8", 512, 1, 4096, 0, 1, 1, 1, 1, 8, 9299),
    ("B200", "Qwen3_235B_a22B", 64, "fp8", 1024, 1, 4096, 0, 1, 8, 1, 2, 8, 3269),
    ("H100", "LLAMA3_8B", 8, "fp8", 128, 1, 8192, 1, 1, 1, 1, 1, 1, 14451),
    ("H100", "LLAMA3_70B", 64, "fp8", 128, 1, 8192, 0, 4, 8, 1, 5, 1, 1602),
    ("H100", "LLAMA3.1_405B", 1024, "fp8", 512, 1, 8192, 0, 8, 8, 2, 8, 1, 292),
    ("H100", "GPT OSS 120B", 64, "bf16", 512, 4, 4096, 0, 1, 4, 1, 1, 8, 5630),
    ("H100", "Qwen3_30B_a3B", 16, "fp8", 512, 2, 4096, 0, 1, 2, 1, 24, 8, 5275),
]
# Assumptions for Megatron-Bridge (the table gives the layout, not these): distributed
# optimizer (ZeRO-1; FSDP rows ZeRO-3), SP and TP communication overlap whenever TP > 1 (the
# performance recipes turn both on), gradient reduce / parameter gather overlapped, no
# activation recomputation, EP all-to-all not overlapped, fused kernels; FP8-CS and FP8-MX both
# run the FP8 peak. MoE rows are force-balanced and dropless (the table's note): uniform routing.

# NeMo 24.07, DGX-H100, FP8: (model, GPUs, GBS, MBS, seq, TP, PP, CP, VP, tokens/s/GPU)
_NEMO_ROWS = [("llama2-7b", 8, 128, 1, 4096, 1, 1, 1, 1, 16847),
              ("llama2-13b", 16, 128, 1, 4096, 1, 4, 1, 10, 8646),
              ("llama2-70b", 64, 128, 1, 4096, 4, 4, 1, 20, 1707),
              ("llama3-8b", 8, 128, 1, 8192, 1, 1, 2, 1, 12036),
              ("llama3-70b", 64, 128, 1, 8192, 4, 4, 2, 5, 1533)]
# Assumptions for NeMo 24.07: as for Megatron-Bridge (same Megatron-core recipes).


def _bridge() -> list[Point]:
    out = []
    for sysk, mk, g, dt, gbs, mbs, seq, fsdp, tp, pp, cp, vp, ep, pub in _BRIDGE_ROWS:
        dp = g // (tp * pp * cp)
        L = Layout(tp=tp, pp=pp, dp=dp, cp=cp, ep=ep, vpp=vp, zero=3 if fsdp else 1,
                   sp=tp > 1, tp_overlap=tp > 1)
        out.append(Point(BRIDGE, f"{mk} {g} {sysk} {dt.upper()}, {L.short()} mb{mbs} seq {seq}",
                         PRESETS[_BRIDGE_MODELS[mk]], _SYS[sysk], g, L, gbs, seq, pub,
                         micro_batch=mbs, dtype=dt))
    for mk, g, gbs, mbs, seq, tp, pp, cp, vp, pub in _NEMO_ROWS:
        L = Layout(tp=tp, pp=pp, dp=g // (tp * pp * cp), cp=cp, vpp=vp, zero=1, sp=tp > 1,
                   tp_overlap=tp > 1)
        out.append(Point(NEMO, f"{mk} {g} H100 FP8, {L.short()} seq {seq}", PRESETS[mk],
                         "dgx-h100", g, L, gbs, seq, pub, micro_batch=mbs, dtype="fp8"))
    return out


def _torchtitan() -> list[Point]:
    """torchtitan, Dec 2024, Grand Teton H100 (96 GB HBM2e, 500 W; the system file
    systems/grand-teton-h100.json), TPS/GPU at iteration 90.

    Assumptions: FSDP = ZeRO-3 (with PP, FSDP keeps the gathered weights for the step:
    ZeRO-2); "selective activation checkpointing" (op level) = recompute "selective"; without
    torch.compile eager kernels, with it fused; Float8 = FP8 GEMMs; the 405B interleaved
    schedule has v = 2 and micro-batches of 1 sequence; seq 8192 (the Llama 3 train configs)."""
    l8, l70, l405 = PRESETS["llama3-8b"], PRESETS["llama3-70b"], PRESETS["llama3-405b"]
    out = []
    for g, rows in ((8, ((5762, "eager", "bf16", "FSDP"),
                         (6667, "fused", "bf16", "FSDP + compile"),
                         (8532, "fused", "fp8", "FSDP + compile + Float8"))),
                    (128, ((5605, "eager", "bf16", "FSDP"),
                           (6514, "fused", "bf16", "FSDP + compile"),
                           (8380, "fused", "fp8", "FSDP + compile + Float8")))):
        for pub, k, dt, what in rows:
            out.append(Point(TITAN, f"Llama 3.1 8B, {g} H100, {what}", l8, GRAND_TETON, g,
                             Layout(dp=g, zero=3, recompute="selective"), 2 * g, 8192, pub,
                             micro_batch=2, dtype=dt, kernels=k))
    for pub, ov in ((829, False), (876, True)):
        L = Layout(tp=8, dp=32, zero=3, sp=True, tp_overlap=ov, recompute="full")
        out.append(Point(TITAN, "Llama 3.1 70B, 256 H100, FSDP32 TP8 Float8"
                         + (" AsyncTP" if ov else ""), l70, GRAND_TETON, 256, L, 512, 8192,
                         pub, micro_batch=16, dtype="fp8"))
    for pub, v in ((100, 1), (128, 2)):
        L = Layout(tp=8, pp=8, dp=8, vpp=v, zero=2, sp=True, tp_overlap=True,
                   recompute="full")
        out.append(Point(TITAN, "Llama 3.1 405B, 512 H100, FSDP8 TP8 PP8 "
                         + ("1F1B" if v == 1 else "interleaved 1F1B"), l405, GRAND_TETON, 512,
                         L, 256, 8192, pub, dtype="fp8"))
    # A100 (docs/performance.md): 64 A100 80GB, FSDP2, local batch 1, eager; the fabric is not
    # given: dgx-a100 assumed.
    out.append(Point(TITAN_A100, "Llama 3 8B, 64 A100, FSDP, selective op AC", l8, "dgx-a100",
                     64, Layout(dp=64, zero=3, recompute="selective"), 64, 8192, 2973,
                     kernels="eager"))
    out.append(Point(TITAN_A100, "Llama 3 70B, 64 A100, FSDP, full AC", l70, "dgx-a100", 64,
                     Layout(dp=64, zero=3, recompute="full"), 64, 8192, 331, kernels="eager"))
    return out


# LLM Foundry: (table, size, layers, hidden, heads, GPUs, MBS, GA, AC, tokens/s/GPU) at seq
# 2048: sizes 7b, 13b, 30b, 70b, the largest GPU count each table lists.
_FOUNDRY_ROWS = [
    ("H100", "7b", 32, 4096, 32, 8, 6, 1, False, 10643),
    ("H100", "13b", 40, 5120, 40, 64, 2, 1, False, 4800),
    ("H100", "30b", 48, 7168, 64, 32, 14, 3, True, 2308),
    ("H100", "70b", 80, 8192, 64, 64, 8, 4, True, 1039),
    ("A100", "7b", 32, 4096, 32, 8, 6, 2, False, 4641),
    ("A100", "13b", 40, 5120, 40, 8, 2, 3, False, 2262),
    ("A100", "30b", 48, 7168, 64, 8, 3, 21, True, 916),
    ("A100", "70b", 80, 8192, 64, 64, 8, 4, True, 410),
]
# Assumptions for LLM Foundry: FSDP FULL_SHARD = ZeRO-3, activation checkpointing = full
# recompute, eager kernels (no torch.compile in the benchmark configs), flash attention; the
# A100 table's cluster has 8 x 200G RoCE per node (dgx-a100); the H100 table does not say
# (dgx-h100 assumed).


def _foundry() -> list[Point]:
    out = []
    for gpu, size, nl, h, a, g, mbs, ga, ac, pub in _FOUNDRY_ROWS:
        L = Layout(dp=g, zero=3, recompute="full" if ac else "none")
        out.append(Point(FOUNDRY, f"MPT-{size}, {g} {gpu}, FSDP, mb{mbs} x {ga}"
                         + (", AC" if ac else ""), _mpt(size, nl, h, a, 2048),
                         "dgx-h100" if gpu == "H100" else "dgx-a100", g, L, mbs * ga * g, 2048,
                         pub, micro_batch=mbs, kernels="eager"))
    return out


def _dsv3() -> list[Point]:
    # PP16, EP64, ZeRO-1 DP over the rest (TP 1), FP8 GEMMs, DualPipe overlapping the EP
    # all-to-all (ep_overlap; its two-directional schedule stands in as v = 2), global batch
    # 15360 x 4096 (the batch it reaches), micro-batch 1, no recompute (the report recomputes
    # only RMSNorm and the MLA up-projections); the MTP module is left out.
    L = Layout(pp=16, dp=128, ep=64, vpp=2, zero=1, ep_overlap=True)
    return [Point(DSV3, "DeepSeek-V3, 2048 H800 FP8, PP16 EP64 DP128", PRESETS["deepseek-v3"],
                  "dgx-h800", 2048, L, 15360, 4096, 1e12 / (180e3 * 3600), dtype="fp8")]


EXCLUDED = {
    "Megatron-Bridge 25.11 DGX-H100 Qwen3_235B_a22B (TP2 PP8 EP32)":
        "EP 32 spans TP x DP (expert tensor parallelism decoupled from TP), which a layout "
        "here cannot express (ep must divide cp*dp = 16)",
    "Megatron-Bridge 25.11 DGX-GB300 rows": "no GB300 system or GPU row",
    "LLM Foundry A100 40GB table": "no A100 40GB GPU row",
}


def points() -> list[Point]:
    """Every point: the fitting set first, then the held-out set."""
    return fitting() + _bridge() + _torchtitan() + _foundry() + _dsv3()

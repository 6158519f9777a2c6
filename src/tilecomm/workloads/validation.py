"""Published training throughputs a reader can check, and the model's prediction for each.

Nothing here is fitted: every point uses the same per-GPU-type efficiency from topology/gpus.py.
``python -m tilecomm.workloads.validation`` prints the table in docs/model.md.

Sources:
* MEGATRON: Narayanan et al. 2021, "Efficient Large-Scale Language Model Training on GPU
  Clusters Using Megatron-LM" (arXiv 2104.04473, SC'21), Table 1: GPT models, vocabulary
  51,200, sequence 2048, A100 80GB (Selene: DGX A100, 8x HDR 200G per node); "achieved
  teraFLOP/s per GPU" counted with their eq. 3 (full s^2 attention, activation recomputation).
* LLAMA3: Dubey et al. 2024, "The Llama 3 Herd of Models" (arXiv 2407.21783), Table 4:
  Llama 3 405B on H100 (8 GPUs per server on NVLink, 400 Gb/s RoCE per GPU), TFLOPs/GPU and
  BF16 MFU.
"""

from __future__ import annotations

from dataclasses import dataclass

from .layout import Layout
from .models import PRESETS, ModelSpec
from .training import train_step

MEGATRON = "Narayanan et al. 2021 (arXiv 2104.04473) Table 1"
LLAMA3 = "Dubey et al. 2024 (arXiv 2407.21783) Table 4"


@dataclass(frozen=True)
class Point:
    source: str
    label: str
    model: ModelSpec
    system: str
    gpus: int
    layout: Layout
    global_batch: int
    seq: int
    published_tflops: float      # per GPU, in the source's convention
    convention: str              # "megatron" (hw_tflops_per_gpu) or "mfu" (mfu x peak)


def _gpt(params: str, heads: int, hidden: int, layers: int) -> ModelSpec:
    return ModelSpec(f"gpt-{params}", layers, hidden, heads, heads, 4 * hidden, 51200,
                     gated_ffn=False, tied_embeddings=True, bias=True, learned_positions=2048,
                     dropout=True, source=MEGATRON)


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
# Assumptions for Table 1 (the table does not give them): micro-batch 1, plain 1F1B, full
# activation recomputation (eq. 3 counts it), no SP (it postdates the paper), gradients
# all-reduced after the backward pass (no overlap in the 2021 code), no ZeRO.
# (GPUs, CP, DP, seq, sequences per DP rank, TFLOPs/GPU): Table 4, TP 8 and PP 16 throughout.
_LLAMA3_ROWS = [(8192, 1, 64, 8192, 32, 430), (16384, 1, 128, 8192, 16, 400),
                (16384, 16, 8, 131072, 16, 380)]
# Assumptions for Table 4: SP on, interleaved schedule with v = 4 (the paper uses interleaving
# but does not give v), micro-batch 1, optimizer state sharded (ZeRO-1), gradient reduction
# overlapped with backward, no recomputation; the RoCE fabric is modeled by dgx-h100's 400G
# rail-optimized fat tree.


def points() -> list[Point]:
    out = []
    for name, a, h, nl, tp, pp, g, b, pub in _MEGATRON_ROWS:
        L = Layout(tp=tp, pp=pp, dp=g // (tp * pp), recompute="full", zero=0,
                   dp_overlap=False)
        out.append(Point(MEGATRON, f"GPT {name}, {g} A100, TP{tp} PP{pp}", _gpt(name, a, h, nl),
                         "dgx-a100", g, L, b, 2048, pub, "megatron"))
    for g, cp, dp, seq, bpd, pub in _LLAMA3_ROWS:
        L = Layout(tp=8, pp=16, dp=dp, cp=cp, vpp=4, sp=True, zero=1)
        out.append(Point(LLAMA3, f"Llama 3 405B, {g} H100, TP8 CP{cp} PP16 DP{dp}, seq {seq}",
                         PRESETS["llama3-405b"], "dgx-h100", g, L, dp * bpd, seq, pub, "mfu"))
    return out


def evaluate(p: Point) -> dict:
    """Prediction for one point: TFLOP/s per GPU in the source's convention, and the error."""
    r = train_step(p.model, p.system, p.gpus, p.layout, p.global_batch, 1, p.seq)
    from .comm import spec_of
    from ..topology.gpus import gpu_of
    peak = gpu_of(spec_of(p.system)).peak("bf16")
    pred = r.hw_tflops_per_gpu if p.convention == "megatron" else r.mfu * peak / 1e12
    return {"source": p.source, "point": p.label, "published": p.published_tflops,
            "predicted": pred, "error": (pred - p.published_tflops) / p.published_tflops,
            "fits": r.fits, "memory_GB": r.memory["total"] / 1e9,
            "largest_exposed": max(("tp", "pp", "dp", "cp", "bubble"),
                                   key=lambda k: r.breakdown_s[k])}


def table() -> list[dict]:
    return [evaluate(p) for p in points()]


def markdown(rows: list[dict]) -> str:
    lines = ["| source | point | published TFLOP/s/GPU | predicted | error | largest non-compute "
             "| memory GB (fits) |", "|---|---|---:|---:|---:|---|---:|"]
    for r in rows:
        lines.append(f"| {r['source']} | {r['point']} | {r['published']:.0f} | "
                     f"{r['predicted']:.0f} | {r['error']:+.1%} | {r['largest_exposed']} | "
                     f"{r['memory_GB']:.0f} ({'yes' if r['fits'] else 'no'}) |")
    return "\n".join(lines)


if __name__ == "__main__":
    rows = table()
    print(markdown(rows))
    errs = [abs(r["error"]) for r in rows]
    print(f"\nmean |error| {sum(errs) / len(errs):.1%}, max {max(errs):.1%}")

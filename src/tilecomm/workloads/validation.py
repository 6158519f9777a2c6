"""The model against published training runs: held-out error first, then in-sample.

``python -m tilecomm.workloads.validation`` prints the tables in docs/model.md ("Workload
model"); ``--fit`` re-fits ``gemm.DERATE`` on the fitting set (the only fitted number of the
compute side) and prints it. The points and the split are in :mod:`.published`.

Errors are ``predicted / published - 1`` in the source's metric: tokens/s per GPU for every
held-out point; TFLOP/s per GPU for the fitting set (the metric those papers report).
"""

from __future__ import annotations

import math
import statistics
import sys

from .gemm import DERATE
from .published import SOURCES, Point, points
from .training import train_step


def predict(p: Point, derate: float = DERATE) -> tuple[float, object]:
    """The model's value of ``p``'s metric, and the step result."""
    r = train_step(p.model, p.system, p.gpus, p.layout, p.global_batch, p.micro_batch, p.seq,
                   p.dtype, kernels=p.kernels, derate=derate)
    if p.metric == "tokens":
        return r.tokens_per_s_per_gpu, r
    if p.metric == "megatron":
        return r.hw_tflops_per_gpu, r
    from ..topology.gpus import gpu_of
    from .comm import spec_of
    return r.mfu * gpu_of(spec_of(p.system)).peak("bf16") / 1e12, r


def evaluate(p: Point, derate: float = DERATE) -> dict:
    """One point: published and predicted value, error, what limits the step, memory."""
    pred, r = predict(p, derate)
    k, share = r.limiter
    return {"source": p.source, "point": p.label, "metric": p.metric, "held_out": p.held_out,
            "moe": p.model.is_moe,
            "published": p.published, "predicted": pred,
            "error": pred / p.published - 1, "limiter": f"{k} {share:.0%}",
            "fits": r.fits, "memory_GB": r.memory["total"] / 1e9}


def fit_derate(pts: list[Point] | None = None, lo: float = 0.3, hi: float = 1.2,
               iters: int = 14) -> float:
    """``derate`` at which the median log error of the *fitting* points is zero (bisection;
    predictions grow with ``derate``). Held-out points are dropped before anything is computed
    (NOTE [fitting and held-out sets] in :mod:`.published`)."""
    fit = [p for p in (points() if pts is None else pts) if not p.held_out]
    if not fit:
        raise ValueError("no fitting points")

    def bias(d: float) -> float:
        return statistics.median(math.log(predict(p, d)[0] / p.published) for p in fit)

    for _ in range(iters):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if bias(mid) < 0 else (lo, mid)
    return (lo + hi) / 2


def table(derate: float = DERATE) -> list[dict]:
    return [evaluate(p, derate) for p in points()]


def _fmt(v: float) -> str:
    return f"{v:,.0f}" if v >= 100 else f"{v:.1f}"


def markdown(rows: list[dict]) -> str:
    """``rows`` as a table (the docs' form), in their metric's unit."""
    unit = "tokens/s/GPU" if all(r["metric"] == "tokens" for r in rows) else "TFLOP/s/GPU"
    out = [f"| source | point | published {unit} | predicted | error | limited by "
           "| memory GB (fits) |", "|---|---|---:|---:|---:|---|---:|"]
    for r in rows:
        out.append(f"| {r['source']} | {r['point']} | {_fmt(r['published'])} | "
                   f"{_fmt(r['predicted'])} | {r['error']:+.1%} | {r['limiter']} | "
                   f"{r['memory_GB']:.0f} ({'yes' if r['fits'] else 'no'}) |")
    return "\n".join(out)


def summary(rows: list[dict]) -> str:
    """Median and worst |error|: held out, each held-out source, then in sample."""
    lines = []
    for held, name in ((True, "held out"), (False, "in sample (fitting set)")):
        e = [abs(r["error"]) for r in rows if r["held_out"] == held]
        worst = max((r for r in rows if r["held_out"] == held), key=lambda r: abs(r["error"]))
        lines.append(f"{name}: {len(e)} points, median |error| {statistics.median(e):.1%}, "
                     f"worst {worst['error']:+.1%} ({worst['point']})")
        if held:
            for kind, moe in (("dense", False), ("MoE", True)):
                es = [abs(r["error"]) for r in rows if r["held_out"] and r["moe"] == moe]
                if es:
                    lines.append(f"  {kind}: {len(es)} points, median |error| "
                                 f"{statistics.median(es):.1%}, max {max(es):.1%}")
            for src in dict.fromkeys(r["source"] for r in rows if r["held_out"]):
                es = [abs(r["error"]) for r in rows if r["source"] == src]
                n = f"{len(es)} point" + ("s" if len(es) > 1 else "")
                lines.append(f"  {src}: {n}, median |error| {statistics.median(es):.1%}, "
                             f"max {max(es):.1%}")
    return "\n".join(lines)


def report(rows: list[dict]) -> str:
    """The whole printout: held-out table and summary first, then in-sample, then sources."""
    held = [r for r in rows if r["held_out"]]
    ins = [r for r in rows if not r["held_out"]]
    return "\n".join([
        f"Held out ({len(held)} points, never used in a fit; derate {DERATE}):", "",
        markdown(held), "", f"In sample ({len(ins)} points, the fitting set):", "",
        markdown(ins), "", summary(rows), "", "Sources:",
        *(f"  {k}: {v}" for k, v in SOURCES.items())])


def main(argv: list[str]) -> int:
    if "--fit" in argv:
        print(f"derate fitted on the fitting set: {fit_derate():.3f} (gemm.DERATE = {DERATE})")
        return 0
    print(report(table()))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

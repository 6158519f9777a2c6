"""Pictures: stacked bars of step time and a per-rank timeline of one step (matplotlib, lazy)."""

from __future__ import annotations

from .report import cluster_text
from .training import PARALLELISMS

COLORS = {"compute": "#4c72b0", "hbm": "#4c72b0", "tp": "#dd8452", "cp": "#937860",
          "ep": "#8172b3", "pp": "#da8bc3", "dp": "#55a868", "bubble": "#c0c0c0",
          "optimizer": "#64b5cd",
          # serve mode: prefill latency and the KV-cache move, then decode_<part> (the decode
          # step's parts, colored as the parts themselves)
          "prefill_ttft": "#8c8c8c", "kv_transfer": "#c44e52"}
_SPARE = ("#64b5cd", "#ccb974", "#8c613c", "#a1c9f4")


def _color(key: str, spare: dict) -> str:
    """The color of a breakdown key: its own, its part's (``decode_tp`` -> ``tp``), or a
    spare one (every key gets a color, so no bar is drawn invisible)."""
    if key in COLORS:
        return COLORS[key]
    part = key.split("_", 1)[1] if "_" in key else key
    if part in COLORS:
        return COLORS[part]
    return spare.setdefault(key, _SPARE[len(spare) % len(_SPARE)])


def _plt():
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt


def plot_step(results: list, path: str, title: str = "") -> None:
    """Stacked bar per result (compute, exposed comm per parallelism, bubble) and, for the
    first training result, the timeline of every pipeline stage for one step."""
    plt = _plt()
    train = hasattr(results[0], "step_s")
    fig, axes = plt.subplots(1, 2 if train else 1, figsize=(13 if train else 7, 4.5),
                             squeeze=False)
    ax = axes[0][0]
    # every key of the breakdowns, in their order (serve mode has its own keys)
    keys = [k for k in dict.fromkeys(k for r in results for k in r.breakdown_s)
            if any(r.breakdown_s.get(k, 0) > 0 for r in results)]
    labels = [r.layout.short() for r in results]
    bottom = [0.0] * len(results)
    spare: dict = {}
    for k in keys:
        vals = [r.breakdown_s.get(k, 0.0) for r in results]
        ax.bar(labels, vals, bottom=bottom, color=_color(k, spare), label=k)
        bottom = [b + v for b, v in zip(bottom, vals)]
    ax.set_ylabel("step time (s)" if train else "latency (s)")
    ax.set_title(title or f"{results[0].model} on {cluster_text(results[0])}")
    ax.tick_params(axis="x", rotation=30, labelsize=8)
    ax.legend(fontsize=8)
    if train:
        _timeline(axes[0][1], results[0])
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def _timeline(ax, r) -> None:
    """One step on every pipeline stage (1F1B): stage s idles s/(pp-1) of the bubble while the
    pipeline fills and the rest while it drains, runs each micro-batch's forward+backward
    compute and exposed communication in between, then the DP tail. A legend names the
    colours (only the parts that take time)."""
    from matplotlib.patches import Patch

    L, m = r.layout, r.micro_batches
    b = r.breakdown_s
    per_mb = {k: b[k] / m for k in ("compute", "tp", "cp", "ep", "pp") if b[k] > 0}
    stages = L.pp
    names = [f"stage {s}" for s in range(stages)] if stages > 1 else ["rank 0"]
    drawn: set = set()
    for y in range(stages):
        fill = b["bubble"] * y / (stages - 1) if stages > 1 else 0.0
        spans: dict = {k: [] for k in ("bubble", *per_mb, "dp", "optimizer")}
        t = 0.0
        if fill > 0:
            spans["bubble"].append((0.0, fill))
            t = fill
        for _ in range(m):
            for k, v in per_mb.items():
                spans[k].append((t, v))
                t += v
        drain = b["bubble"] - fill
        if drain > 0:
            spans["bubble"].append((t, drain))
            t += drain
        if b["dp"] > 0:
            spans["dp"].append((t, b["dp"]))
            t += b["dp"]
        if b.get("optimizer", 0) > 0:
            spans["optimizer"].append((t, b["optimizer"]))
        for k, xs in spans.items():     # one artist per part and stage, not per micro-batch
            if xs:
                ax.broken_barh(xs, (y - 0.35, 0.7), color=COLORS[k], label=k)
                drawn.add(k)
    ax.set_yticks(range(stages), names, fontsize=8 if stages <= 16 else 5)
    ax.invert_yaxis()                   # stage 0 on top, as pipeline diagrams draw it
    ax.set_xlabel("time in step (s)")
    ax.set_title(f"timeline, {L.short()}, {m} micro-batches")
    ax.legend(handles=[Patch(color=COLORS[k], label=k)
                       for k in ("compute", *PARALLELISMS, "bubble", "optimizer") if k in drawn],
                       fontsize=8,
              loc="upper left", bbox_to_anchor=(1.0, 1.0))

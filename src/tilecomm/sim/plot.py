"""Plots of predictions (and measurements) against message size, log-scale sizes.

Two panels: time per call (log-log: the latency regime is readable) and bus bandwidth (where the
bandwidth regime is). Each algorithm has one color; its measured points (tilecomm bench rows
name their algorithm) use the same color as unconnected crosses, measurements without an
algorithm (nccl-tests: NCCL chose) black ones. The fastest algorithm per size is ringed.

matplotlib is optional (``pip install tilecomm[plot]``) and imported only here, lazily.
"""

from __future__ import annotations

from pathlib import Path

from ..units import format_size


def plot_sweep(rows: list[dict], path: str, title: str, measured=None) -> dict:
    """``rows``: prediction dicts (``algo, nbytes, time_us, busbw_GBps``, optional ``best``);
    ``measured``: dicts (``source, nbytes, time_us, busbw_GBps``, optional ``algo``).

    Returns what was drawn: ``{"model_lines": n, "measured_series": m}`` (per panel).
    """
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as e:
        raise RuntimeError("plotting needs matplotlib: pip install 'tilecomm[plot]'") from e
    fig, (ax_t, ax_b) = plt.subplots(1, 2, figsize=(13, 5.2))
    algos = sorted({r["algo"] for r in rows})
    cmap = plt.get_cmap("tab10")
    color = {a: cmap(i % 10) for i, a in enumerate(algos)}
    for a in algos:
        pts = sorted((r["nbytes"], r["time_us"], r["busbw_GBps"]) for r in rows if r["algo"] == a)
        xs = [p[0] for p in pts]
        ax_t.plot(xs, [p[1] for p in pts], "-", color=color[a], lw=1.6, label=f"model: {a}")
        ax_b.plot(xs, [p[2] for p in pts], "-", color=color[a], lw=1.6, label=f"model: {a}")
    best = [r for r in rows if r.get("best")]
    if best:
        for ax, key in ((ax_t, "time_us"), (ax_b, "busbw_GBps")):
            ax.plot([r["nbytes"] for r in best], [r[key] for r in best], "o", ms=7, mfc="none",
                    mec="0.3", mew=1.0, label="fastest (tuner's choice)")
    series = 0
    if measured:
        groups = sorted({(m["source"], m.get("algo") if m.get("algo") in color else None)
                         for m in measured}, key=lambda g: (g[0], g[1] or ""))
        for src, a in groups:
            pts = sorted((m["nbytes"], m["time_us"], m["busbw_GBps"]) for m in measured
                         if m["source"] == src and (m.get("algo") if m.get("algo") in color
                                                    else None) == a)
            c = color[a] if a else "black"
            name = Path(src).name if src else "measured"
            label = f"measured: {a} ({name})" if a else f"measured: {name}"
            for ax, i in ((ax_t, 1), (ax_b, 2)):
                ax.plot([p[0] for p in pts], [p[i] for p in pts], "x", color=c, ms=7, mew=1.8,
                        label=label)
            series += 1
    ticks = sorted({r["nbytes"] for r in rows} | {m["nbytes"] for m in (measured or [])})
    step = max(1, -(-len(ticks) // 9))
    for ax in (ax_t, ax_b):
        ax.set_xscale("log", base=2)
        ax.set_xticks(ticks[::step], [format_size(t) for t in ticks[::step]])
        ax.set_xlabel("message size (bytes, log scale)")
        ax.grid(True, which="major", alpha=0.3)
    ax_t.set_yscale("log")
    ax_t.set_ylabel("time per call (us, log scale)")
    ax_t.set_title("time (lower is better)")
    ax_b.set_ylabel("bus bandwidth (GB/s)")
    ax_b.set_title("bus bandwidth (higher is better)")
    ax_b.set_ylim(bottom=0)
    ax_t.legend(fontsize=7.5, loc="upper left")
    fig.suptitle(title + ("  |  lines: model, x: measured" if measured else "  |  lines: model"))
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return {"model_lines": len(algos), "measured_series": series}

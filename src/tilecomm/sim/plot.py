"""Plots of predictions (and measurements): busbw against message size, log-scale sizes.

matplotlib is optional (``pip install tilecomm[plot]``) and imported only here, lazily.
"""

from __future__ import annotations

from .units import format_size


def plot_sweep(rows: list[dict], path: str, title: str, measured=None) -> None:
    """``rows``: prediction dicts (``algo, nbytes, busbw_GBps``); ``measured``: dicts (``source, nbytes, busbw_GBps``)."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as e:
        raise RuntimeError("plotting needs matplotlib: pip install 'tilecomm[plot]'") from e
    fig, ax = plt.subplots(figsize=(8, 5))
    algos = sorted({r["algo"] for r in rows})
    for a in algos:
        pts = sorted((r["nbytes"], r["busbw_GBps"]) for r in rows if r["algo"] == a)
        ax.plot([p[0] for p in pts], [p[1] for p in pts], marker=".", label=f"model: {a}")
    if measured:
        for name in sorted({m["source"] for m in measured}):
            pts = sorted((m["nbytes"], m["busbw_GBps"]) for m in measured if m["source"] == name)
            ax.plot([p[0] for p in pts], [p[1] for p in pts], "k--o", ms=4,
                    label=f"measured: {name}")
    ax.set_xscale("log", base=2)
    ticks = sorted({r["nbytes"] for r in rows})
    step = max(1, len(ticks) // 10)
    ax.set_xticks(ticks[::step], [format_size(t) for t in ticks[::step]])
    ax.set_xlabel("message size (bytes)")
    ax.set_ylabel("bus bandwidth (GB/s)")
    ax.set_title(title)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)

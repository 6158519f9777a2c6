"""``tilecomm model ... --mode serve --plot`` draws its bars (issue 12, gap 7): the serve
breakdown's keys (prefill_ttft, kv_transfer, decode_<part>) had no colors, so the axes were
empty."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402

from tilecomm.cli import main  # noqa: E402


def test_serve_plot_has_a_bar_per_breakdown_part(tmp_path, monkeypatch):
    figs = []
    monkeypatch.setattr(plt, "close", lambda fig=None: figs.append(fig))
    png = tmp_path / "serve.png"
    assert main(["model", "llama3-70b", "--gpus", "8", "--tp", "8", "--mode", "serve",
                 "--batch", "32", "--plot", str(png)]) == 0
    assert png.stat().st_size > 0
    ax = figs[0].axes[0]
    labels = {p.get_label() for p in ax.containers}
    assert {"prefill_ttft", "decode_hbm", "decode_tp"} <= labels, labels
    heights = [bar.get_height() for c in ax.containers for bar in c]
    assert heights and all(h > 0 for h in heights)
    assert len(ax.get_legend().get_texts()) == len(ax.containers)

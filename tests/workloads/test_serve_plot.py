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


def test_training_timeline_draws_every_stage_with_a_legend(tmp_path, monkeypatch):
    """The timeline drew 2 of 4 pipeline stages (the first and the last) and had no legend
    (issue 34): every stage is a row, and the legend names each colour drawn."""
    from matplotlib.colors import to_hex

    figs = []
    monkeypatch.setattr(plt, "close", lambda fig=None: figs.append(fig))
    assert main(["model", "llama3-70b", "--gpus", "1024", "--tp", "8", "--pp", "4",
                 "--plot", str(tmp_path / "step.png")]) == 0
    bars, timeline = figs[0].axes[:2]
    assert bars.get_title() == "llama3-70b on 1024 GPUs in 128 x dgx-h100 nodes"
    assert [t.get_text() for t in timeline.get_yticklabels()] == \
        ["stage 0", "stage 1", "stage 2", "stage 3"]
    rows: dict = {}                   # row -> the colours drawn in it
    for c in timeline.collections:
        y0 = round(c.get_paths()[0].get_extents().y0 + 0.35)
        rows.setdefault(y0, set()).add(to_hex(c.get_facecolor()[0]))
    assert sorted(rows) == [0, 1, 2, 3]
    legend = timeline.get_legend()
    assert legend is not None
    named = {t.get_text(): to_hex(h.get_facecolor())
             for t, h in zip(legend.get_texts(), legend.legend_handles)}
    assert set(named) == {"compute", "tp", "pp", "dp", "bubble", "optimizer"}
    assert set(named.values()) == set().union(*rows.values())
    for y in (1, 2):                  # middle stages idle while the pipeline fills and drains
        assert named["bubble"] in rows[y]

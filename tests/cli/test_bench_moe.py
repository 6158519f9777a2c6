"""``tilecomm bench moe``: every method runs on the same routing, checks clean, and its rows add up."""

from __future__ import annotations

import json

import pytest

from tilecomm.bench import moe as bench_moe
from tilecomm.cli import main

SMALL = ["--tokens", "40", "--hidden", "256", "--topk", "3", "--experts", "8", "--rounds", "1"]


@pytest.mark.parametrize("extra", [[], ["--fp8"], ["--mode", "low_latency"]])
def test_bench_moe_runs_every_method_and_checks(tmp_path, extra):
    out = tmp_path / "moe.json"
    rc = main(["bench", "moe", "-n", "2", *SMALL, *extra, "--json", str(out)])
    assert rc == 0
    (row,) = json.loads(out.read_text())
    assert row["bench"] == "moe" and row["case"].startswith("moe/")
    timed = {m for m in bench_moe.METHODS if f"{'' if m == 'tilecomm' else m + '_'}dispatch_us"
             in row}
    want = {"tilecomm"} if extra == ["--mode", "low_latency"] else set(bench_moe.METHODS)
    assert timed == want
    # normal mode: a row per (source, token) sent here; low-latency: per (token, expert) slot,
    # as DeepEP counts its low-latency bytes
    most = 2 * 40 * (3 if "low_latency" in extra else 1)
    assert row["wrong"] == 0 and 0 < row["rows_per_rank"] <= most
    for m in timed:
        pre = "" if m == "tilecomm" else m + "_"
        assert row[f"{pre}dispatch_gbs"] == pytest.approx(
            row["dispatch_bytes"] / row[f"{pre}dispatch_us"] / 1e3)
        assert row[f"{pre}combine_gbs"] == pytest.approx(
            row["combine_bytes"] / row[f"{pre}combine_us"] / 1e3)
        assert row[f"{pre}wrong"] == 0
    # one round: the phases' medians add up to the method's time
    assert row["dispatch_us"] + row["combine_us"] == pytest.approx(row["time_us"])
    for b in timed - {"tilecomm"}:
        assert row[f"x_{b}"] == pytest.approx(row[f"{b}_time_us"] / row["time_us"])
    per_row = 256 + 4 * 2 if "--fp8" in extra else 512       # fp8 bytes + scales, or bf16
    assert row["dispatch_bytes"] == pytest.approx(row["rows_per_rank"] * per_row)
    assert row["dispatch_bound_us"] > 0 and 0 < row["frac_of_bound"]
    assert row["bound_us"] == pytest.approx(row["dispatch_bound_us"] + row["combine_bound_us"])


def test_the_result_check_can_fail():
    cfg = bench_moe.MoEBenchConfig(tokens=6, hidden=128, topk=2, experts=4)
    x, idx, w = bench_moe._inputs(cfg, 0)
    want = bench_moe._expected(cfg, x, idx, w, 2, 2)
    assert bench_moe._wrong(cfg, want.clone(), want) == 0
    bad = want.clone()
    bad[3, 5] += 1
    assert bench_moe._wrong(cfg, bad, want) == 1


def test_bad_moe_arguments_are_a_clear_error(capsys):
    assert main(["bench", "moe", "-n", "3", *SMALL]) == 2
    assert "multiple of" in capsys.readouterr().err


def test_fp8_expected_result_has_the_combine_signed_zeros():
    """A token whose fp8 block rounds a tiny negative to -0 comes back from combine as +0
    (the float32 accumulator starts at +0); the bench's expected result must say so, or a
    correct run counts wrong tokens (it did at hidden 7168: about 8% of the tokens)."""
    import torch

    from tilecomm.moe import routing

    cfg = bench_moe.MoEBenchConfig(tokens=2, hidden=128, topk=1, experts=2, fp8=True)
    x = torch.zeros((2, 128), dtype=torch.bfloat16)
    x[:, 0] = 1.0
    x[:, 1] = -1e-6                     # far below the block's fp8 resolution: -0
    idx = torch.tensor([[0], [1]])
    want = bench_moe._expected(cfg, x, idx, torch.ones((2, 1)), 1, 2)
    assert routing.dest_mask(idx, 1, 2).sum() == 2
    assert (want[:, 1].view(torch.int16) == 0).all()          # +0, not -0 (0x8000)
    assert want[0, 0] == 1.0

"""Per-GEMM compute, the limiting term, partial racks, and the published-run tables.

The docs' tables must be what the code computes; held-out points must never enter the fit.
"""

import math
from dataclasses import replace
from pathlib import Path

import pytest

from tilecomm.cli import main
from tilecomm.topology.gpus import GPUS
from tilecomm.workloads.gemm import DERATE, attn_eff, gemm_eff, gemm_time
from tilecomm.workloads.layout import Layout
from tilecomm.workloads.models import ModelSpec
from tilecomm.workloads.published import LLAMA3, MEGATRON, fitting, points
from tilecomm.workloads.training import node_size, train_step
from tilecomm.workloads import validation

DOCS = Path(__file__).resolve().parents[2] / "docs" / "model.md"
H100 = GPUS["H100"]


@pytest.fixture(scope="module")
def rows():
    return validation.table()


def test_tables_in_docs_are_current(rows):
    """Every row and summary line of `python -m tilecomm.workloads.validation` is in
    docs/model.md (a stale table fails), the held-out table before the in-sample one."""
    docs = DOCS.read_text()
    held = validation.markdown([r for r in rows if r["held_out"]])
    ins = validation.markdown([r for r in rows if not r["held_out"]])
    for line in (held + "\n" + ins).splitlines()[2:]:
        assert line in docs, f"docs/model.md validation row is stale; expected:\n{line}"
    for line in validation.summary(rows).splitlines():
        assert line.strip() in docs, f"docs/model.md summary is stale; expected:\n{line}"
    assert docs.index(held.splitlines()[2]) < docs.index(ins.splitlines()[2])


def test_split_is_by_source_and_meets_the_target(rows):
    held = {r["source"] for r in rows if r["held_out"]}
    fit = {r["source"] for r in rows if not r["held_out"]}
    assert fit == {MEGATRON, LLAMA3} and not held & fit
    assert all(r["metric"] == "tokens" for r in rows if r["held_out"])
    errs = sorted(abs(r["error"]) for r in rows if r["held_out"])
    assert len(errs) >= 40
    assert errs[len(errs) // 2] <= 0.20          # the target: median |error| <= 20%


def test_derate_is_what_the_fitting_set_gives():
    assert validation.fit_derate() == pytest.approx(DERATE, abs=1e-3)


def test_held_out_points_never_enter_the_fit():
    """A held-out sentinel that would raise if evaluated, and one with an absurd published
    value, leave the fit unchanged."""
    fit = fitting()[:3]
    boom = replace(fit[0], system="no-such-system", held_out=True)
    absurd = replace(fit[1], published=1e9, held_out=True)
    base = validation.fit_derate(fit, iters=6)
    assert validation.fit_derate(fit + [boom, absurd], iters=6) == base
    with pytest.raises(ValueError, match="no fitting points"):
        validation.fit_derate([boom, absurd])


def test_gemm_efficiency_follows_the_shape():
    big = gemm_eff(8192, 8192, 8192, H100)
    mb, nb, kb = H100.mamf_shape
    assert gemm_eff(mb, nb, kb, H100, derate=1.0) == pytest.approx(H100.mamf_bf16)
    assert gemm_eff(mb, nb, kb, H100) == pytest.approx(H100.mamf_bf16 * DERATE)
    assert gemm_eff(8192, 8192, 256, H100) < gemm_eff(8192, 8192, 1024, H100) < big
    assert gemm_eff(64, 8192, 8192, H100) < 0.6 * big          # half of a 128-row tile
    assert gemm_eff(8192, 8192, 8192, H100, "fp8") < big       # FP8's MAMF fraction is lower
    # roofline: 16 rows against an 8192 x 8192 weight read it from HBM
    t = gemm_time(16, 8192, 8192, H100, 3350e9)
    assert t.hbm_bound and t.seconds == pytest.approx(
        2 * (16 * 8192 * 2 + 8192 * 8192) / (3350e9 * 0.8))
    assert not gemm_time(8192, 8192, 8192, H100, 3350e9).hbm_bound
    # flash attention: slower for short sequences and small heads
    assert attn_eff(512, 128, H100) < attn_eff(8192, 128, H100)
    assert attn_eff(8192, 64, H100) < attn_eff(8192, 128, H100)


def test_step_names_its_limiting_term():
    kw = dict(micro_batch=1, seq=4096)
    r = train_step("llama3-8b", "dgx-h100", 8, Layout(dp=8), global_batch=64, **kw)
    assert r.limiter[0] == "compute: GEMM" and 0.4 < r.limiter[1] < 1
    assert sum(r.compute_s.values()) == pytest.approx(
        r.breakdown_s["compute"] + r.breakdown_s["optimizer"])
    bub = train_step("llama3-70b", "dgx-h100", 64, Layout(tp=8, pp=8, sp=True),
                     global_batch=8, **kw)
    assert bub.limiter[0] == "pp bubble"
    tiny = ModelSpec("tiny", layers=2, hidden=512, heads=8, kv_heads=8, ffn=2048, vocab=32000)
    dp = train_step(tiny, "dgx-a100", 64, Layout(dp=64, zero=0, dp_overlap=False),
                    global_batch=64, micro_batch=1, seq=512)
    assert dp.limiter[0] == "dp comm exposed"
    d = r.as_dict()
    assert d["limiter"] == r.limiter[0] and d["limiter_share"] == r.limiter[1]


def test_partial_racks():
    assert node_size(256, 72) == 64 and node_size(144, 72) == 72 and node_size(8, 72) == 72
    assert node_size(256, 72, 32) == 32
    with pytest.raises(ValueError, match="--gpus-per-node"):
        node_size(100, 72)
    with pytest.raises(ValueError, match="not a whole number of 8-GPU nodes"):
        node_size(12, 8)
    with pytest.raises(ValueError, match="exceeds the 72 GPUs"):
        node_size(256, 72, 80)
    r = train_step("llama3-70b", "gb200-nvl72", 256, Layout(tp=2, pp=4, dp=32, sp=True),
                   global_batch=256, seq=8192)
    assert r.gpus_per_node == 64
    assert r.groups["dp"] == "32 ranks in 1 node"          # 32 x TP2 = one 64-GPU rack


def test_cli_gb200_256_gpus_and_limiter(capsys):
    assert main(["model", "llama3-70b", "--system", "gb200-nvl72", "--gpus", "256", "--tp",
                 "2", "--pp", "4", "--sp", "--global-batch", "256", "--seq", "8192"]) == 0
    out = capsys.readouterr().out
    assert "256 GPUs in 4 x gb200-nvl72 nodes (64 of 72 GPUs each)" in out
    assert "limited by: compute: GEMM" in out
    assert main(["model", "llama3-70b", "--system", "gb200-nvl72", "--nodes", "2",
                 "--gpus-per-node", "64", "--tp", "8", "--kernels", "eager", "--json"]) == 0
    import json
    d = json.loads(capsys.readouterr().out)
    assert d["gpus"] == 128 and d["gpus_per_node"] == 64 and d["kernels"] == "eager"
    assert main(["model", "llama3-70b", "--system", "gb200-nvl72", "--gpus", "100"]) == 2
    assert "--gpus-per-node" in capsys.readouterr().err


def test_eager_kernels_cost_more_element_wise_time():
    kw = dict(global_batch=16, micro_batch=2, seq=8192)
    L = Layout(dp=8, zero=3)
    fused = train_step("llama3-8b", "dgx-h100", 8, L, **kw)
    eager = train_step("llama3-8b", "dgx-h100", 8, L, kernels="eager", **kw)
    assert eager.compute_s["elementwise"] > 2 * fused.compute_s["elementwise"]
    assert eager.compute_s["gemm"] == fused.compute_s["gemm"]
    assert math.isclose(eager.step_s - fused.step_s,
                        eager.compute_s["elementwise"] - fused.compute_s["elementwise"],
                        rel_tol=1e-6)
    with pytest.raises(ValueError, match="kernels must be one of"):
        train_step("llama3-8b", "dgx-h100", 8, L, kernels="jit", **kw)


def test_every_point_is_a_valid_description():
    """Each published point's layout covers its GPUs and its batch divides evenly."""
    for p in points():
        assert p.layout.gpus == p.gpus, p.label
        assert p.global_batch % (p.layout.dp * p.micro_batch) == 0, p.label

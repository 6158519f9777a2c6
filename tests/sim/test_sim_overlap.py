"""The overlap model (tilecomm.sim.overlap, `tilecomm sim overlap`): the chunk-pipeline
recurrences at their limits, the predictions' consistency, the CLI, and that the workload
model's --tp-overlap charges the same exposed communication."""

from __future__ import annotations

import json

import pytest

from tilecomm.cli import main
from tilecomm.sim.overlap import (exposed_comm, pipeline_all_gather, pipeline_reduce_scatter,
                                  predict_overlap)


def test_pipelines_at_their_limits():
    # no communication: the GEMM alone; no GEMM: the communication alone
    assert pipeline_all_gather(0.0, 800.0, 8) == pytest.approx(800.0)
    assert pipeline_all_gather(700.0, 0.0, 8) == pytest.approx(700.0)
    assert pipeline_reduce_scatter(0.0, 800.0, 8) == pytest.approx(800.0)
    assert pipeline_reduce_scatter(700.0, 0.0, 8, 5.0) == pytest.approx(705.0)
    # communication-bound: all of it plus the one chunk GEMM that cannot overlap
    assert pipeline_all_gather(7000.0, 800.0, 8) == pytest.approx(7000.0 + 100.0)
    # compute-bound with steps shorter than a chunk: fully hidden
    assert pipeline_all_gather(600.0, 800.0, 8) == pytest.approx(800.0)
    assert exposed_comm(600.0, 800.0, 8) == 0.0
    assert exposed_comm(7000.0, 800.0, 8) == pytest.approx(6300.0)
    assert pipeline_all_gather(5.0, 7.0, 1) == 7.0


def test_predictions_are_consistent():
    p = predict_overlap("all_gather_matmul", 8192, 8192, 28672, 8, "dgx-h100")
    assert p.unfused_us == pytest.approx(p.gemm_us + p.comm_us)
    assert max(p.gemm_us, p.comm_us) <= p.fused_us + 1e-9 <= p.unfused_us + 1e-9
    assert 0.0 <= p.hidden <= 1.0 and p.speedup >= 1.0
    # the A800 preset: A100 compute, NVLink cut from 600 to 400 GB/s: slower all_gather
    a800 = predict_overlap("all_gather_matmul", 4096, 12288, 49152, 8, "dgx-a800")
    a100 = predict_overlap("all_gather_matmul", 4096, 12288, 49152, 8, "dgx-a100")
    assert a800.gemm_us == pytest.approx(a100.gemm_us)
    assert a800.comm_us > 1.4 * a100.comm_us
    with pytest.raises(ValueError, match="--n .* multiple of --tp"):
        predict_overlap("all_gather_matmul", 8192, 8192, 28670, 8)
    with pytest.raises(ValueError, match="--k .* multiple of --tp"):
        predict_overlap("matmul_reduce_scatter", 8192, 8190, 28672, 8)


def test_cli_sim_overlap(tmp_path, capsys):
    out = tmp_path / "o.json"
    assert main(["sim", "overlap", "--system", "dgx-h100", "--tp", "8", "--m", "8192",
                 "--k", "8192", "--n", "28672", "--dtype", "bf16", "--json", str(out)]) == 0
    text = capsys.readouterr().out
    assert "all_gather_matmul" in text and "matmul_reduce_scatter" in text
    rows = json.loads(out.read_text())
    assert [r["op"] for r in rows] == ["all_gather_matmul", "matmul_reduce_scatter"]
    assert rows[0] == predict_overlap("all_gather_matmul", 8192, 8192, 28672, 8).as_dict()


def test_float32_partials_cost_twice_the_bytes_of_bf16_ones():
    kw = dict(op="matmul_reduce_scatter", m=8192, k=8192, n=28672, tp=8, system="dgx-h100")
    f32, bf16 = predict_overlap(**kw, partials="fp32"), predict_overlap(**kw)
    assert f32.unfused_us == bf16.unfused_us
    assert f32.fused_us > bf16.fused_us

"""Inference and serving, search, the CLI and the plot (validation: test_validation.py)."""

import json
import re

import pytest

from tilecomm.cli import main
from tilecomm.workloads.inference import infer
from tilecomm.workloads.layout import Layout
from tilecomm.workloads.models import PRESETS
from tilecomm.workloads.search import explain, search_infer, search_train

def test_decode_is_hbm_bound_and_kv_transfer_matches_bytes():
    m = PRESETS["llama3-70b"]
    r = infer(m, "dgx-h100", Layout(tp=8), batch=32, prompt=2048, gen=256, mode="decode")
    assert "hbm" in r.breakdown_s and r.breakdown_s["tp"] > 0
    assert r.kv_bytes_per_request == 2048 * m.kv_bytes_per_token()
    assert r.tokens_per_s == pytest.approx(32 / r.latency_s)
    s = infer(m, "dgx-h100", Layout(tp=8), batch=32, prompt=2048, gen=256, mode="serve")
    # 8 KV heads over TP 8: eight 1/8 shards, one per NIC, across nodes at ~48.5 GB/s.
    assert s.kv_transfer_s == pytest.approx(2048 * m.kv_bytes_per_token() / 8 / 48.5e9, rel=0.3)
    p = infer(m, "dgx-h100", Layout(tp=8), batch=32, prompt=2048, mode="prefill")
    assert s.breakdown_s["prefill_ttft"] == pytest.approx(p.latency_s)
    assert p.breakdown_s["compute"] > 0 and p.latency_s > r.latency_s


def test_decode_memory_counts_kv_cache():
    m = PRESETS["llama3-8b"]
    r = infer(m, "dgx-h100", Layout(tp=1), batch=8, prompt=1000, gen=24, mode="decode")
    assert r.memory["kv_cache"] == pytest.approx(8 * 1024 * m.kv_bytes_per_token())


def test_search_respects_memory_and_is_sorted():
    rs = search_train("llama3-70b", "dgx-h100", 64, global_batch=64, seq=4096)
    assert rs and all(r.fits for r in rs)
    assert all(r.memory["total"] <= r.memory["usable"] for r in rs)
    steps = [r.step_s for r in rs]
    assert steps == sorted(steps)
    # 70B with 18 bytes/param cannot run TP1 PP1: every result shards the model.
    assert all(r.layout.tp * r.layout.pp > 1 for r in rs)
    text = explain(rs)
    assert rs[0].layout.short() in text and "Best:" in text


def test_search_infer_sorted_by_latency():
    rs = search_infer("llama3-70b", "dgx-h100", 8, batch=16, mode="decode")
    lat = [r.latency_s for r in rs]
    assert lat == sorted(lat) and rs[0].layout.tp == 8


def test_cli_json_parses(capsys):
    rc = main(["model", "llama3-8b", "--system", "dgx-h100", "--gpus", "16", "--tp", "2",
               "--sp", "--global-batch", "32", "--seq", "4096", "--json"])
    assert rc == 0
    d = json.loads(capsys.readouterr().out)
    assert d["layout"]["dp"] == 8 and d["micro_batches"] == 4
    assert d["step_s"] == pytest.approx(sum(d["breakdown_s"].values()))
    assert {c["collective"] for c in d["collectives"] if c["parallelism"] == "tp"} == \
        {"all_gather", "reduce_scatter"}


def test_cli_search_and_plot(tmp_path, capsys):
    png = tmp_path / "step.png"
    rc = main(["model", "mixtral-8x7b", "--system", "dgx-h100", "--nodes", "2", "--search",
               "--top", "8", "--global-batch", "32", "--plot", str(png)])
    assert rc == 0
    out = capsys.readouterr().out
    assert "Best:" in out and "EP" in out
    assert png.stat().st_size > 10_000 and png.read_bytes()[:4] == b"\x89PNG"


def test_reports_name_gpus_and_nodes(capsys):
    """A system preset is one node: 1024 GPUs of dgx-h100 are 128 nodes, not "1024 x
    dgx-h100" (issue 34), in the breakdown, the search table and the inference line."""
    for argv, head in (
            (["llama3-70b", "--gpus", "1024", "--tp", "8", "--pp", "4"],
             "llama3-70b on 1024 GPUs in 128 x dgx-h100 nodes (H100"),
            (["llama3-8b", "--nodes", "2", "--search", "--top", "2", "--global-batch", "64"],
             "llama3-8b on 16 GPUs in 2 x dgx-h100 nodes (H100"),
            (["llama3-70b", "--gpus", "8", "--tp", "8", "--mode", "decode"],
             "llama3-70b decode on 8 GPUs in 1 dgx-h100 node: TP8")):
        assert main(["model", *argv]) == 0
        out = " ".join(capsys.readouterr().out.split())
        assert head in out, out[:300]
        assert not re.search(r"on \d+ x dgx", out)


@pytest.mark.parametrize("argv, msg", [
    (["model", "llama9"], "unknown model 'llama9'; presets: deepseek-v3"),
    (["model", "llama3-70b", "--gpus", "32", "--tp", "16"], "exceeds the 8 GPUs"),
    (["model", "llama3-8b", "--gpus", "16", "--ep", "2"], "needs an MoE model"),
    (["model", "llama3-8b", "--system", "dgx-z"], "unknown system 'dgx-z'"),
    (["model", "llama3-8b", "--system", "/no/such.json"], "system file /no/such.json not found"),
    (["model", "llama3-70b", "--gpus", "16", "--tp", "3"], "tp*pp*cp = 3 does not divide"),
    (["model", "llama3-70b", "--gpus", "16", "--tp", "16"], "exceeds the 8 GPUs"),
    (["model", "llama3-8b", "--gpus", "12", "--tp", "4"], "not a whole number of 8-GPU"),
    (["model", "llama3-8b", "--gpus", "16", "--global-batch", "20"],
     "global_batch=20 must be a multiple of dp*micro_batch = 16*1"),
    (["model", "llama3-8b", "--gpus", "16", "--tp", "-2"], "tp must be a positive integer"),
    (["model", "llama3-8b", "--gpus", "16", "--seq", "0"], "--seq must be >= 1"),
    (["model", "llama3-8b", "--gpus", "8", "--mode", "decode", "--batch", "0"],
     "--batch must be >= 1"),
    (["model", "llama3-8b", "--gpus", "8", "--mode", "decode", "--gen", "-1"],
     "--gen must be >= 0"),
    (["model", "llama3-8b", "--gpus", "8", "--mode", "decode", "--cp", "2"],
     "context parallelism is modeled for training only"),
    (["model", "mixtral-8x7b", "--gpus", "16", "--tp", "2", "--ep", "2"],
     "needs sequence parallelism"),
    (["model", "mixtral-8x7b", "--gpus", "16", "--ep", "3"], "ep=3 must divide the 8 experts"),
    (["model", "llama3-8b", "--gpus", "8", "--dtype", "fp8", "--system", "dgx-a100"],
     "no FP8 tensor cores"),
    (["model", "llama3-70b", "--gpus", "16", "--search"], "fits in memory"),
])
def test_cli_errors_exit_2_without_traceback(argv, msg, capsys):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert msg in err and "Traceback" not in err


@pytest.mark.parametrize("body, msg", [
    ({"hidden": 64, "heads": 4, "kv_heads": 2, "ffn": 128, "vocab": 100},
     "missing field(s) layers"),
    ({"layers": -2}, "layers must be >= 1, got -2"),
    ({"head_dim": -1}, "head_dim must be >= 0, got -1"),
    ({"vocab": "100"}, "vocab must be an integer, got '100'"),
    ({"experts": -4}, "experts must be >= 0"),
    ({"experts": 4}, "top_k must be in 1..experts (4), got 0"),
    ({"gated_ffn": "yes"}, "gated_ffn must be true or false"),
    ({"heads": 3}, "heads (3) must be a multiple of kv_heads (2)"),
    ({"name": 5}, "model name must be a non-empty string"),
])
def test_cli_bad_model_file_exit_2(tmp_path, capsys, body, msg):
    good = {"layers": 2, "hidden": 64, "heads": 4, "kv_heads": 2, "ffn": 128, "vocab": 100}
    p = tmp_path / "m.json"
    p.write_text(json.dumps(body if "layers" not in body and "hidden" in body
                            else {**good, **body}))
    assert main(["model", str(p), "--gpus", "8"]) == 2
    err = capsys.readouterr().err
    assert msg in err and str(p) in err and "Traceback" not in err
    assert len(err.strip().splitlines()) == 1

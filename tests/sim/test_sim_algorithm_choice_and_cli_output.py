"""`tilecomm sim` / `topo` and the predict API as a user meets them: an explicit algorithm is
checked against the collective, sizes it cannot run are reported as skipped, the bottleneck is
named, CLI errors are clean, titles and legends say what is shown, nccl-tests logs are compared
with NCCL's own algorithms."""

import json

import pytest

from tilecomm.sim import predict
from tilecomm.sim.api import candidates, skipped
from tilecomm.sim.cli import main
from tilecomm.topology import build

# nccl-tests all_reduce_perf on 2 ranks (busbw column deliberately not time-derived).
NCCL_LOG = """\
# nThread 1 nGpus 2 minBytes 1024 maxBytes 4096 step: 2(factor) warmup iters: 5 iters: 20
#  Rank  0 Group  0 Pid  11 on   node1 device  0 [0x18] NVIDIA H100 80GB HBM3
#  Rank  1 Group  0 Pid  11 on   node1 device  1 [0x2a] NVIDIA H100 80GB HBM3
#       size         count      type   redop    root     time   algbw   busbw #wrong     time
        1024           256     float     sum      -1    10.50    0.10    0.10      0    10.20    0.10    0.10      0
        2048           512     float     sum      -1    11.00    0.19    0.19      0    10.90    0.19    0.19      0
        4096          1024     float     sum      -1    11.60    0.35    0.35      0    11.40    0.36    0.36      0
"""


@pytest.mark.parametrize("kw, message", [
    (dict(system="dgx-a100", algo="nvls"), "dgx-a100 has no NVLS"),
    (dict(system="dgx-h100", algo="nvls", nodes=2), "multi-node NVLS .* not modeled"),
    (dict(system="dgx-h100", algo="bogus", nodes=2),
     "unknown algorithm 'bogus' for all_reduce on dgx-h100 x2; choose from hier_rail.*"
     "with --what-if also .*ring"),
    (dict(system="dgx-h100", algo="one_shot", nodes=64), "too large .*choose from"),
    (dict(system="dgx-h100", algo="ring", nodes=2), "ring is a what-if .*hier_rail.*--what-if"),
    (dict(system="dgx-h100", algo="dbtree"), "dbtree is a what-if .*not in the runtime"),
    (dict(system="dgx-h100", algo="hierarchical", nodes=2), "hierarchical is a what-if"),
    (dict(system="dgx-h100", algo="hier_rail"), "hier_rail runs on ranks across hosts"),
])
def test_explicit_algorithm_is_checked(kw, message):
    with pytest.raises(ValueError, match=message):
        predict("all_reduce", 1 << 20, **kw)


def test_explicit_algorithm_wrong_collective():
    with pytest.raises(ValueError, match="unknown algorithm 'ring' for broadcast.*direct, tree"):
        predict("broadcast", 1 << 20, algo="ring")


def test_skipped_for_size():
    topo = build("dgx-h100", 64)
    assert skipped("all_reduce", topo, what_if=True) == ["one_shot", "two_shot"]
    assert not set(skipped("all_reduce", topo, True)) & set(candidates("all_reduce", topo, True))
    assert skipped("all_reduce", topo) == []     # the runtime's hier plans fit at 512 ranks
    assert skipped("all_reduce", build("dgx-h100", 1)) == []
    assert skipped("all_gather", topo) == ["hier_rail", "hier_leader"]


def test_analytic_bottleneck_is_latency_when_alpha_dominates():
    small = {p.algo: p.bottleneck for p in predict("all_reduce", 1024, what_if=True)}
    assert small["nvls"] == "latency" and small["dbtree"] == "latency"
    big = {p.algo: p.bottleneck for p in predict("all_reduce", 1 << 30, what_if=True)}
    assert big["nvls"] == "nvswitch" and big["dbtree"] == "gpu_tx"
    multi = predict("all_reduce", 1 << 30, nodes=2, algo="dbtree", what_if=True)[0]
    assert multi.bottleneck == "nic_tx"


def test_cli_errors_are_clean(capsys):
    for argv, message in [
        (["--protocol", "bogus"], "no protocol 'bogus'; choose from LL, LL128, Simple"),
        (["--gpus", "0"], "gpus per node must be in 1..8, got 0"),
        (["--algo", "nvls", "--system", "dgx-a100"], "has no NVLS"),
    ]:
        with pytest.raises(SystemExit) as e:
            main(["sim", "all_reduce", "-b", "1K", "-e", "1K", *argv])
        assert e.value.code == 2
        assert message in capsys.readouterr().err


def test_cli_protocol_any_case_title_and_legend(tmp_path, capsys):
    f = tmp_path / "sys.json"
    f.write_text(json.dumps({"name": "my-h100", "base": "dgx-h100"}))
    assert main(["sim", "all_reduce", "--system", str(f), "--protocol", "simple",
                 "-b", "1M", "-e", "1M", "--algo", "ring"]) == 0
    out = capsys.readouterr().out
    assert "all_reduce on my-h100 x1" in out and str(f) not in out
    assert "Simple" in out and "model's fastest" in out and "tuner" not in out


@pytest.mark.slow
def test_cli_multi_node_ring_is_labeled_and_skips_reported(capsys):
    # the phase engine: the labels and the skip report are the point here, not the engine
    # (the event engine takes ~10 s on 512 ranks' recursive doubling)
    assert main(["sim", "all_reduce", "--nodes", "64", "-b", "1M", "-e", "1M",
                 "--what-if", "--engine", "phases"]) == 0
    out = capsys.readouterr().out
    assert "ring (1 channel, what-if)" in out and "Known gaps" in out
    assert "skipped: one_shot, two_shot (too many moves at 512 ranks)" in out
    assert main(["sim", "all_reduce", "-b", "1M", "-e", "1M"]) == 0
    assert "1 channel" not in capsys.readouterr().out


def test_cli_nccl_log_compared_with_nccl_algorithms(tmp_path, capsys):
    log = tmp_path / "nccl.log"
    log.write_text(NCCL_LOG)
    out = tmp_path / "p.json"
    assert main(["sim", "all_reduce", "--gpus", "2", "-b", "1K", "-e", "4K",
                 "--measured", str(log), "--json", str(out)]) == 0
    text = capsys.readouterr().out
    data = json.loads(out.read_text())
    # busbw is the log's own column, not recomputed from the number of '# Rank' lines
    assert [m["busbw_GBps"] for m in data["measured"]] == [0.10, 0.19, 0.35]
    for line in text.splitlines():
        if "10.50" in line:   # the 1K measurement sits on a row of an algorithm NCCL has
            assert any(a in line for a in ("ring", "dbtree", "nvls")), line
            assert "one_shot" not in line and "two_shot" not in line
    assert "10.50" in text and "warning" not in text


def test_cli_nccl_log_world_size_mismatch_warns(tmp_path, capsys):
    log = tmp_path / "nccl.log"
    log.write_text(NCCL_LOG)   # 2 ranks; the model runs 8
    assert main(["sim", "all_reduce", "-b", "1K", "-e", "4K", "--measured", str(log)]) == 0
    assert "warning: " in capsys.readouterr().out


def test_engine_events_limit_names_the_cli_flag():
    from tilecomm.sim.api import flow_schedule
    from tilecomm.sim.engine import simulate_events
    topo = build("dgx-h100", 64)
    fs = flow_schedule("all_reduce", "ring", topo)
    with pytest.raises(ValueError, match="--engine phases"):
        simulate_events(fs, topo, topo.spec.protocol("Simple"), 1 << 20, max_flows=10)

import json
import os
import subprocess
import sys

import pytest

from tilecomm.sim import best, predict, why
from tilecomm.sim.cli import main
from tilecomm.sim.measured import parse_bench_json, parse_nccl_tests
from tilecomm.units import format_size, parse_size, sizes

NCCL_LOG = """\
# nThread 1 nGpus 1 minBytes 1024 maxBytes 4096 step: 2(factor) warmup iters: 5 iters: 20
# Using devices
#  Rank  0 Group  0 Pid  11 on   node1 device  0 [0x18] NVIDIA H100 80GB HBM3
#  Rank  1 Group  0 Pid  12 on   node1 device  1 [0x2a] NVIDIA H100 80GB HBM3
#
#                                                              out-of-place                       in-place
#       size         count      type   redop    root     time   algbw   busbw #wrong     time   algbw   busbw #wrong
#        (B)    (elements)                               (us)  (GB/s)  (GB/s)            (us)  (GB/s)  (GB/s)
        1024           256     float     sum      -1    10.50    0.10    0.10      0    10.20    0.10    0.10      0
        2048           512     float     sum      -1    11.00    0.19    0.19      0    10.90    0.19    0.19      0
        4096          1024     float     sum      -1    11.60    0.35    0.35      0    11.40    0.36    0.36      0
# Out of bounds values : 0 OK
# Avg bus bandwidth    : 0.21
"""


def test_parse_size():
    assert parse_size("8") == 8 and parse_size("1K") == 1024
    assert parse_size("256M") == 256 << 20 and parse_size("8G") == 8 << 30
    assert parse_size("1KiB") == 1024 and format_size(8 << 30) == "8G"
    assert sizes(1024, 8192, 2) == [1024, 2048, 4096, 8192]
    with pytest.raises(ValueError):
        parse_size("lots")


def test_parse_nccl_tests_log():
    rows = parse_nccl_tests("./build/all_reduce_perf -b 1K\n" + NCCL_LOG)
    assert [r.nbytes for r in rows] == [1024, 2048, 4096]
    assert rows[0].time_us == 10.5 and rows[0].world_size == 2
    assert rows[0].collective == "all_reduce"
    assert parse_nccl_tests(NCCL_LOG, "all_reduce", inplace=True)[2].time_us == 11.4


def test_parse_bench_json():
    rows = parse_bench_json([{"collective": "all_reduce", "algo": "ring", "world_size": 4,
                              "bytes": 4096, "time_us": 50.0, "algbw_gbs": 0.08,
                              "busbw_gbs": 0.12}])
    assert rows[0].nbytes == 4096 and rows[0].algo == "ring" and rows[0].time_us == 50.0


def test_predict_and_best():
    preds = predict("all_reduce", 1 << 30, system="dgx-h100")
    assert preds == sorted(preds, key=lambda p: p.time_us)
    b = best("all_reduce", 1 << 30, system="dgx-h100", what_if=True)
    assert b.algo == "nvls" and 400 < b.busbw_GBps < 500 and b.what_if
    ours = best("all_reduce", 1 << 30, system="dgx-h100")      # the runtime's algorithms only
    assert ours.algo == "two_shot" and not ours.what_if
    ring = predict("all_reduce", 1 << 30, system="dgx-h100", algo="ring")[0]
    assert 330 < ring.busbw_GBps < 380      # measured 365-370 (nccl-tests#212)
    small = best("all_reduce", 1024, system="dgx-a100")
    assert small.bottleneck == "latency"
    assert "bottleneck" in why("all_reduce", 1 << 30, system="dgx-h100", nodes=2)


def test_predict_multi_node_nic_bound():
    p = predict("all_reduce", 1 << 30, system="dgx-h100", nodes=4, algo="ring", what_if=True)[0]
    assert p.bottleneck.startswith("nic") and p.what_if
    h = predict("all_reduce", 1 << 30, system="dgx-h100", nodes=4, algo="hier_rail")[0]
    assert h.bottleneck.startswith("nic") and not h.what_if


def test_cli_sim_table_and_json(tmp_path, capsys):
    out = tmp_path / "p.json"
    log = tmp_path / "nccl.log"
    log.write_text(NCCL_LOG)
    rc = main(["sim", "all_reduce", "--system", "dgx-h100", "-b", "1K", "-e", "4K", "-f", "2",
               "--json", str(out), "--measured", str(log)])
    assert rc == 0
    text = capsys.readouterr().out
    assert "one_shot" in text and "measured" in text
    data = json.loads(out.read_text())
    assert {r["nbytes"] for r in data["predictions"]} == {1024, 2048, 4096}
    assert sum(r["best"] for r in data["predictions"]) == 3
    assert len(data["measured"]) == 3


def test_cli_topo_preset_subprocess():
    r = subprocess.run([sys.executable, "-m", "tilecomm.sim.cli", "topo", "--system",
                        "gb200-nvl72", "--nodes", "2"], capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 0, r.stderr
    assert "144 ranks" in r.stdout and "nic_tx" in r.stdout


def test_cli_topo_local(capsys):
    assert main(["topo", "--no-measure"]) == 0
    assert "cores" in capsys.readouterr().out


def test_plot(tmp_path):
    # matplotlib is a test dependency (pyproject [test]): no skip.
    from tilecomm.sim.plot import plot_sweep
    out = tmp_path / "p.png"
    assert main(["sim", "all_reduce", "-b", "1K", "-e", "1M", "-f", "8", "--plot", str(out)]) == 0
    data = out.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 20_000
    rows = [{**p.as_dict(), "best": i == 0} for n in (1024, 1 << 20)
            for i, p in enumerate(predict("all_reduce", n, system="dgx-h100"))]
    measured = [{"source": "bench.json", "algo": "ring", "nbytes": 1024, "time_us": 20.0,
                 "busbw_GBps": 0.1},
                {"source": "nccl.log", "algo": "nccl", "nbytes": 1024, "time_us": 10.5,
                 "busbw_GBps": 0.2}]
    drawn = plot_sweep(rows, str(tmp_path / "m.png"), "t", measured)
    assert drawn == {"model_lines": len({r["algo"] for r in rows}), "measured_series": 2}


def test_cli_measured_bench_json_matches_algorithms(tmp_path, capsys):
    bench = os.path.join(os.path.dirname(__file__), "..", "..", "benchmarks", "results",
                         "cpu_all_reduce_2ranks_user.json")
    out = tmp_path / "cpu.json"
    rows = json.load(open(bench))
    size = min(r["bytes"] for r in rows)
    measured = {r["algo"]: r["time_us"] for r in rows if r["bytes"] == size}
    assert main(["sim", "all_reduce", "--system", "cpu-shm", "--gpus", "2", "-b", str(size),
                 "-e", str(size), "--measured", bench, "--json", str(out),
                 "--plot", str(tmp_path / "cpu.png")]) == 0
    text = capsys.readouterr().out
    # every algorithm's row is compared with its own measurement
    assert len(measured) == 4
    for algo, t in measured.items():
        assert f"{t:.2f}" in text, (algo, t)
    assert (tmp_path / "cpu.png").stat().st_size > 20_000

"""The benchmark harness and CLI: every operation runs, checks clean, and reports sane rows."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tilecomm.bench.cases import CASES
from tilecomm.cli import main
from tilecomm.units import format_size, parse_size


def test_parse_and_format_sizes():
    assert parse_size("8") == 8 and parse_size("1K") == 1024 and parse_size("256M") == 256 << 20
    assert parse_size("8G") == 8 << 30 and parse_size("64KiB") == 64 << 10
    assert format_size(256 << 20) == "256M" and format_size(1000) == "1000"
    for bad in ("", "x", "1.5", "-4"):
        with pytest.raises(ValueError):
            parse_size(bad)


@pytest.mark.parametrize("op", list(CASES))
def test_every_operation_benchmarks_and_checks(tmp_path, op):
    out = tmp_path / "rows.json"
    rc = main(["bench", op, "-n", "3", "-b", "8", "-e", "4K", "-f", "16", "--check",
               "--iters", "2", "--rounds", "1", "--no-bound", "--json", str(out)])
    assert rc == 0
    rows = json.loads(out.read_text())
    assert [r["collective"] for r in rows] == [op] * 3
    for r in rows:
        assert r["wrong"] == 0
        assert r["time_us"] > 0 and r["busbw_gbs"] > 0
        assert r["algbw_gbs"] == pytest.approx(r["bytes"] / r["time_us"] / 1e3)


def test_all_algorithms_heap_memory_gloo_and_bound(tmp_path):
    out = tmp_path / "rows.json"
    rc = main(["bench", "all_reduce", "-n", "2", "-b", "1K", "-e", "1K", "--algo", "all",
               "--mem", "heap", "--vs", "gloo", "--check", "--iters", "3", "--rounds", "2",
               "--json", str(out)])
    assert rc == 0
    rows = json.loads(out.read_text())
    from tilecomm.algorithms import algorithms
    assert {r["algo"] for r in rows} == set(algorithms("all_reduce"))
    for r in rows:
        assert r["wrong"] == 0 and r["mem"] == "heap"
        # every ratio reads the same way: the baseline's time over tilecomm's
        assert r["gloo_time_us"] > 0 and r["x_gloo"] == pytest.approx(
            r["gloo_time_us"] / r["time_us"])
        assert len(r["rounds_us"]) == 2 and r["time_us"] == pytest.approx(sum(r["rounds_us"]) / 2)
        assert r["spread"] == pytest.approx(max(r["rounds_us"]) / min(r["rounds_us"]))
        assert r["noisy"] == (r["noisy_methods"] != []) and r["case"].startswith("all_reduce/")
        assert r["bound_us"] > 0 and r["copy_gbs"] > 0


def test_bad_cli_input_is_a_clear_error(capsys):
    assert main(["bench", "all_reduce", "-b", "1K", "-e", "8", "--rounds", "1"]) == 2
    assert "minbytes" in capsys.readouterr().err
    assert main(["bench", "all_reduce", "--algo", "nope", "-e", "8"]) == 2
    assert "unknown algorithm" in capsys.readouterr().err
    assert main(["bench", "all_reduce", "-d", "uint8", "-e", "8"]) == 2
    assert "data movement only" in capsys.readouterr().err


def test_settings_are_checked(monkeypatch):
    from tilecomm.settings import settings
    monkeypatch.setenv("TILECOMM_START_METHOD", "bogus")
    settings.cache_clear()
    try:
        with pytest.raises(ValueError, match="TILECOMM_START_METHOD"):
            settings()
        monkeypatch.setenv("TILECOMM_START_METHOD", "fork")
        monkeypatch.setenv("TILECOMM_HEAP_BYTES", "lots")
        settings.cache_clear()
        with pytest.raises(ValueError, match="TILECOMM_HEAP_BYTES"):
            settings()
    finally:
        monkeypatch.undo()
        settings.cache_clear()


def test_doctor_runs(capsys):
    assert main(["doctor"]) == 0
    out = capsys.readouterr().out
    assert "TILECOMM_TIMEOUT" in out and "self-test: ok" in out
    assert "backend 'tilecomm': registered" in out and "triton " in out
    assert "native runner: " in out and "TILECOMM_NATIVE" in out


@pytest.mark.slow
def test_doctor_device_without_cuda_says_so_and_exits_1(capsys):
    """``doctor --device`` runs the GPU check's own preflight (issue 34): on a machine
    without CUDA it says so in plain words and exits 1 (documented in --help). In a
    subprocess: the preflight imports triton, which the pytest process must not (the rank
    pools fork from it and turn the interpreter on before triton is imported)."""
    import torch
    if torch.cuda.is_available():
        pytest.skip("this test is for machines without CUDA")
    r = subprocess.run([sys.executable, "-m", "tilecomm.cli", "doctor", "--device"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 1, r.stdout + r.stderr
    out = " ".join(r.stdout.split())
    assert "self-test: ok" in out
    assert "device: no CUDA device on this machine" in out
    assert "device preflight: 0 GPU(s), " in out and "CANNOT RUN: torch sees no CUDA device" in out
    with pytest.raises(SystemExit):
        main(["doctor", "--help"])
    assert "--device found that the GPU path cannot run here" in \
        " ".join(capsys.readouterr().out.split())


def test_doctor_device_prints_the_gpu_checks_preflight(capsys, monkeypatch):
    """Its findings are the preflight's (no copy of its logic): a passing preflight exits 0
    with its summary and warnings, one with a problem exits 1 with the verdict."""
    from tilecomm.bench.gpucheck import preflight as gpu_preflight
    calls = []

    def fake(interpret, problems=()):
        calls.append(interpret)
        return {"probe": {"cuda_available": True}, "summary": "2 GPU(s) H100, H100",
                "warnings": ["no ncu (Nsight Compute): no kernel profile"],
                "problems": list(problems),
                "verdict": "CANNOT RUN: " + "; ".join(problems) if problems else "ok"}

    monkeypatch.setattr(gpu_preflight, "preflight", fake)
    assert main(["doctor", "--device"]) == 0
    out = capsys.readouterr().out
    assert calls == [False]
    assert "device preflight: 2 GPU(s) H100, H100: ok" in out
    assert "warning: no ncu" in out and "no CUDA device" not in out
    monkeypatch.setattr(gpu_preflight, "preflight",
                        lambda i: fake(i, ["GPU 0 compute mode Prohibited"]))
    assert main(["doctor", "--device"]) == 1
    assert "CANNOT RUN: GPU 0 compute mode Prohibited" in capsys.readouterr().out


@pytest.mark.slow
def test_torchrun_init(tmp_path):
    """tilecomm.init() under torchrun rendezvouses through torch.distributed's store."""
    env = dict(os.environ, OMP_NUM_THREADS="1")
    script = os.path.join(os.path.dirname(__file__), "..", "..", "examples",
                          "torchrun_all_reduce.py")
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone",
                           "--nproc-per-node", "2", script], capture_output=True, text=True,
                          timeout=120, env=env)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.count(" ok") == 2, proc.stdout


def test_init_outside_torchrun_says_how_to_start(monkeypatch):
    import tilecomm
    for v in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(v, raising=False)
    with pytest.raises(RuntimeError, match="torchrun"):
        tilecomm.init()

"""tilecomm bench on the kernel path: --device, the shared case ids, and a timing loop whose
data stays bounded (in-place sums re-filled, untimed, before they overflow)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch

from tilecomm.bench.cases import BenchCase, bench_table, kernel_table
from tilecomm.bench.runner import safe_chunk
from tilecomm.bench.timing import Clock, time_rounds
from tilecomm.cli import main

pytestmark = [pytest.mark.gpu, pytest.mark.interpreter]

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))


def test_case_ids():
    assert BenchCase("all_reduce", "one_shot", "float32", 8192, "heap", "sum", 2).id == \
        "all_reduce/one_shot/sum/float32/heap/8K/w2"
    assert BenchCase("all_gather", "ring", "int32", 1000, "user", "sum", 4).id == \
        "all_gather/ring/int32/user/1000/w4"
    t = bench_table("broadcast", ["direct"], [8, 64], "float16", "heap", world=3)
    assert [c.id for c in t] == ["broadcast/direct/float16/heap/8/w3",
                                 "broadcast/direct/float16/heap/64/w3"]


def test_kernel_table_covers_registered_dtypes_and_ops():
    class Spec:
        dtypes = (torch.float32, torch.bfloat16, torch.int32)
        ops = ("sum", "avg", "max")
    rows = kernel_table({("all_reduce", "one_shot"): Spec()}, 2, [8, 64], full_sizes=[64])
    got = {(c.dtype, c.redop) for c in rows}
    # avg needs a float dtype: the Communicator refuses int32 avg, so the table leaves it out
    assert got == {(d, o) for d in ("float32", "bfloat16", "int32") for o in Spec.ops} - \
        {("int32", "avg")}
    assert {c.mem for c in rows} == {"user", "heap"}
    assert {c.nbytes for c in rows if (c.dtype, c.redop) == ("float32", "sum")} == {8, 64}


def test_safe_chunk_keeps_sums_finite():
    for dt in (torch.float32, torch.float16, torch.bfloat16, torch.int32):
        for w in (2, 3, 8):
            k = safe_chunk("all_reduce", dt, w)
            top = torch.finfo(dt).max if dt.is_floating_point else torch.iinfo(dt).max
            assert w ** k <= top, (dt, w, k)
    assert safe_chunk("all_gather", torch.float32, 2) is None
    assert safe_chunk("all_reduce", torch.float32, 2, "max") is None


def test_time_rounds_refills_untimed_every_chunk():
    calls, fills = [], []
    times = time_rounds(lambda: None, lambda: calls.append(1), 3, 10, 2,
                        refill=lambda: fills.append(len(calls)), chunk=4,
                        clock=Clock(torch.device("cpu")))
    assert len(times) == 2 and len(calls) == 23
    # before warm-up call 0 and 3 (chunk 4 -> refill at 0), then 3 refills per round of 10
    assert fills == [0, 3, 7, 11, 13, 17, 21]


def test_device_cuda_without_a_gpu_is_a_clear_error(capsys):
    if torch.cuda.is_available():
        pytest.skip("a GPU is visible")
    assert main(["bench", "all_reduce", "-e", "8", "--device", "cuda", "--rounds", "1"]) == 2
    assert "no CUDA device" in capsys.readouterr().err


@pytest.mark.slow
def test_kernel_path_stays_bounded_and_checks(tmp_path):
    """Under TILECOMM_CPU_KERNELS=triton the bench runs every all_reduce kernel (interpreter),
    warnings as errors; 30 calls of an in-place sum of ones over 2 ranks would reach 2**30
    (float16 overflows above 65504, 2**16): the timed loop re-fills the input every 14 calls
    (``runner.safe_chunk``), and without it the interpreter raises 'overflow encountered in
    cast' (issue 12, gap 8, whose 40-call test of ``auto`` alone this one absorbed)."""
    out = tmp_path / "rows.json"
    env = {k: v for k, v in os.environ.items() if k not in ("TRITON_INTERPRET",)}
    env.update(TILECOMM_CPU_KERNELS="triton", PYTHONWARNINGS="error::RuntimeWarning")
    r = subprocess.run([sys.executable, "-m", "tilecomm.cli", "bench", "all_reduce", "-n", "2",
                        "-b", "8", "-e", "8", "--algo", "all", "--mem", "heap", "--check",
                        "-d", "float16", "--iters", "30", "--warmup", "0", "--rounds", "1",
                        "--no-bound",
                        "--json", str(out)], env=env, capture_output=True, text=True,
                       timeout=120, cwd=ROOT)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "overflow" not in r.stderr, r.stderr[-2000:]
    rows = json.loads(out.read_text())
    assert len(rows) >= 2       # every all_reduce kernel (--algo all on the kernel path)
    for x in rows:
        assert x["wrong"] == 0 and x["case"].startswith("all_reduce/") and x["time_us"] > 0
        assert x["dtype"] == "float16" and x["iters"] == 30


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
@pytest.mark.parametrize("mem", ["user", "heap"])
def test_bench_on_cuda(tmp_path, mem):
    out = tmp_path / "rows.json"
    rc = main(["bench", "all_reduce", "-n", "2", "-b", "8K", "-e", "1M", "-f", "128",
               "--device", "cuda", "--mem", mem, "--check", "--iters", "20", "--rounds", "3",
               "--json", str(out)])
    assert rc == 0
    for x in json.loads(out.read_text()):
        assert x["wrong"] == 0 and x["device"] == "cuda" and x["bound_us"] > 0


def test_bench_deterministic_mode_runs_only_rank_order_algorithms():
    from tilecomm.bench import BenchConfig, run
    from tilecomm.bench.runner import resolve_algos

    cfg = BenchConfig(op="all_reduce", world_size=2, sizes=[64, 1 << 20], algos=["all"],
                      rounds=1, iters=2, warmup=1, check=True, bound=False, deterministic=True)
    assert resolve_algos(cfg) == ["auto", "one_shot", "two_shot"]   # auto beside them
    rows = run(cfg)
    assert {r["algo"] for r in rows} == {"one_shot", "two_shot"}
    assert all(r["deterministic"] and r["wrong"] == 0 for r in rows)
    auto = run(BenchConfig(op="reduce", world_size=2, sizes=[64], rounds=1, iters=2, warmup=1,
                           bound=False, deterministic=True))
    assert auto[0]["algo"] == "direct"

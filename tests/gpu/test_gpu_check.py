"""The GPU check (tilecomm.bench.gpucheck, scripts/gpu_check.py) in its CPU dry run: the same
phases on CPU ranks with the kernels in the Triton interpreter, so CI proves that what a GPU
machine will run works. It runs tilecomm bench's case table (same ids) over every registered
kernel, dtype, reduction and memory kind, and it FAILS when a registered kernel is wrong (a
broken variant registered through the registry, not a hook)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
SCRIPT = os.path.join(ROOT, "scripts", "gpu_check.py")
FAKE_MPS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fake_mps_control.py")

pytestmark = [pytest.mark.gpu, pytest.mark.interpreter, pytest.mark.slow]


def _env(**extra):
    env = {k: v for k, v in os.environ.items()
           if k not in ("TRITON_INTERPRET", "OUT", "TILECOMM_CPU_KERNELS")
           and not k.startswith("CUDA_MPS")}
    env.update(extra)
    return env


def _py(code: str, timeout=300, **env):
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], env=_env(**env),
                          capture_output=True, text=True, timeout=timeout, cwd=ROOT)


def _expected_table():
    """The correctness table the dry run must run, built here from the registry (this process
    runs the kernels in the interpreter, as the dry run's ranks do: tests/conftest.py)."""
    from tilecomm.bench.gpucheck import config, kernels as K

    c = config(True)
    fused, plans = K.registered(c)
    rows = K.correctness_table(c, 2, fused, plans)
    reg = {f"{o}/{a}": [[str(d)[6:] for d in s.dtypes], list(s.ops)]
           for (o, a), s in fused.items()}
    return ([x.id for x in rows], reg, [f"{o}/{a}" for o, a in plans],
            [K.first(x) for x in rows])


def _run(out, *extra, timeout=300, **env):
    r = subprocess.run([sys.executable, SCRIPT, "--interpret", "--out", str(out), *extra],
                       env=_env(**env), capture_output=True, text=True, timeout=timeout,
                       cwd=ROOT)
    with open(os.path.join(out, "gpu_check.json")) as f:
        return r, json.load(f)


@pytest.fixture(scope="module")
def dry_run(tmp_path_factory):
    """The whole dry run, once for the tests that read it: ``(completed process, record,
    output directory)``."""
    out = tmp_path_factory.mktemp("dry_run")
    return (*_run(out), out)


@pytest.mark.timeout(400)      # ~20 s here; no wall-clock budget may skip a case (CI is slower)
def test_dry_run_passes_every_phase_and_reports_the_case_table(dry_run):
    ids, registered, schedules, first = _expected_table()
    r, res, tmp_path = dry_run
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert res["verdict"] == "PASS" and res["all_correct"] and res["skipped_cases"] == 0
    assert res["env"]["mode"] == "interpret" and res["worlds"] == {"2": "ok"}
    assert res["preflight"]["summary"] == "no GPU (interpret mode)"
    assert set(res["kernels"]) == set(registered) | {f"{k}/plan" for k in schedules}
    from tilecomm.bench.gpucheck import PHASES
    assert set(res["phase_times"]) == {n for n, _ in PHASES}
    assert res["cta_budget"]["2"]["source"] == "interpreter"
    recs = res["records"]
    checks = [c for c in recs if "ok" in c]
    for c in checks:
        assert c["ok"] is True or c.get("applicable") is False, c
    # the case table, by its ids, rows that never passed on a GPU first
    table = [c["case"] for c in recs if c["phase"] == "correctness" and "engine" in c]
    assert table == ids and first == sorted(first, reverse=True) and any(first)
    # every dtype and reduction each kernel registers, staged and zero-copy memory
    for k, (dtypes, ops) in registered.items():
        mine = [c for c in checks if c.get("kernel") == k]
        assert {c["dtype"] for c in mine} == set(dtypes), k
        assert {c["mem"] for c in mine} == {"user", "heap"}, k
        if k.split("/")[0] in ("all_reduce", "reduce_scatter", "reduce"):
            assert {c["redop"] for c in mine} == set(ops), k
        rows = [t for t in recs if t["phase"] == "timing" and t.get("kernel") == k]
        assert rows and all(t["us"].get("tilecomm", 0) > 0 and not t["errors"]
                            for t in rows), rows
    # the plan kernel: every registered schedule, fp32 and bf16, sum and avg, both memories
    for k in schedules:
        mine = [c for c in checks if c.get("kernel") == f"{k}/plan"]
        assert mine and all(c["case"].endswith("/plan") and c["engine"] == "plan"
                            for c in mine), k
        assert {c["dtype"] for c in mine} >= {"float32", "bfloat16"}, k
        assert {c["mem"] for c in mine} == {"user", "heap"}, k
        if k.split("/")[0] in ("all_reduce", "reduce_scatter", "reduce"):
            assert {c["redop"] for c in mine} >= {"sum", "avg"}, k
    # bits on random floats: every fused kernel of a reducing collective vs its plan twin
    bits = [c for c in checks if c["phase"] == "bits"]
    for k, (dtypes, ops) in registered.items():
        if k.split("/")[0] in ("all_reduce", "reduce_scatter", "reduce"):
            mine = [c for c in bits if c["kernel"] == f"{k}/bits"]
            assert {c["dtype"] for c in mine} == {"float32", "bfloat16", "float16"} & \
                set(dtypes), k
            assert {c["redop"] for c in mine} == {"sum", "avg"} & set(ops), k
            assert all(c["engines"] == ["fused", "plan"] for c in mine), k
    assert any(c["vs_reference"] for c in bits)
    det = [c for c in checks if c["phase"] == "determinism"]
    # auto's choice at the phase's size (the GPU preset's prediction; on 2 GPUs two_shot
    # starts above the dry run's 512 KiB cap, so it is one_shot there)
    from tilecomm import tuner
    from tilecomm.algorithms.lower import deterministic_algorithms
    from tilecomm.backends.triton import registry as kreg
    avail = deterministic_algorithms("all_reduce", 2, among=kreg.supported("all_reduce"))
    want = tuner.choose("all_reduce", det[0]["bytes"], 2, kind="gpu", available=avail)
    assert len(det) == 1 and det[0]["ok"] and det[0]["algo_auto"] == want, det
    seq = [c for c in checks if c["phase"] == "sequence"]
    assert seq and seq[0]["ok"] and len(seq[0]["calls"]) >= 6
    assert len({c.split("/")[0] for c in seq[0]["calls"]}) >= 3     # different operations
    # timing: the sweep of auto, every configured op and size; baselines say why they are off
    sweep = [t for t in recs if t.get("part") == "sweep"]
    assert {(t["case"].split("/")[0], t["bytes"]) for t in sweep} == \
        {(o, n) for o in ("all_reduce", "all_gather") for n in (8, 4096)}
    assert all(t["us"]["tilecomm"] > 0 and "n/a" in t["errors"]["nccl"] for t in sweep)
    assert all("n/a" in t["errors"]["torch symm_mem one_shot"] for t in sweep
               if t["case"].startswith("all_reduce"))
    copy = [t for t in recs if t.get("part") == "copy"]
    assert copy and copy[0]["copy"]["GBps"] > 0
    # the fused ops: both copy variants and the reduce-scatter against the references in fp32
    # and bf16, timed against unfused; no NCCL or PyTorch baseline here
    ops = {(c["kernel"], c["dtype"]): c for c in checks if c["kernel"].startswith("ops/")}
    assert set(ops) == {(f"ops/{k}", d) for k in ("all_gather_matmul/kernel",
                                                   "all_gather_matmul/stream",
                                                   "matmul_reduce_scatter")
                        for d in ("float32", "bfloat16")}, sorted(ops)
    assert all(c["ok"] and c["max_abs_diff"] < 1e-3 for c in ops.values()), ops
    ov = {t["op"]: t for t in recs if t["phase"] == "overlap" and "us" in t}
    assert set(ov["all_gather_matmul"]["us"]) == {
        "fused copy=kernel", "fused copy=stream", "unfused tilecomm all_gather + matmul"}, ov
    assert set(ov["matmul_reduce_scatter"]["us"]) == {
        "fused", "unfused matmul + tilecomm reduce_scatter"}, ov
    assert ov["all_gather_matmul"]["faster_copy"] in ("fused copy=kernel", "fused copy=stream")
    assert all("n/a" in t["errors"]["torch symm_mem fused"] for t in ov.values()), ov
    # MoE: normal (bf16, fp8) and low-latency checked against the reference, then timed
    moe = [c for c in checks if c["phase"] == "moe"]
    assert {c["kernel"] for c in moe if c["ok"]} == {"moe/normal", "moe/low_latency"}, moe
    mt = [t for t in recs if t["phase"] == "moe" and "ms" in t]
    assert len(mt) == 4 and all(t["ms"]["tilecomm dispatch"] > 0 for t in mt), mt
    assert {(t["mode"], t["fp8"]) for t in mt} == {(m, f) for m in ("normal", "low_latency")
                                                  for f in (False, True)}
    lat = next(t for t in recs if t["phase"] == "latency")
    assert lat["us"] and all(v > 0 for v in lat["us"].values()) and not lat["errors"], lat
    graph = [c for c in recs if c["phase"] == "graph"]
    assert "n/a" in graph[0]["error"] and graph[0]["applicable"] is False
    assert "n/a" in res["profile"]["status"]
    with open(os.path.join(tmp_path, "gpu_check.txt")) as f:
        text = f.read()
    assert "RESULT: PASS" in text and text.strip() in r.stdout
    assert "preflight: no GPU (interpret mode)" in text
    assert "faster all-gather copy:" in text and "CTA budget w2: 4 per launch" in text


def test_case_ids_are_tilecomm_bench_ids(dry_run, tmp_path):
    """The bench on the kernel path names its rows as the check's table does (the dry run's
    timing phase)."""
    _, res, _ = dry_run
    out = tmp_path / "rows.json"
    r = subprocess.run([sys.executable, "-m", "tilecomm.cli", "bench", "all_reduce", "-n", "2",
                        "-b", "1K", "-e", "1K", "--algo", "one_shot", "--mem", "heap",
                        "--check", "--iters", "2", "--rounds", "1", "--no-bound",
                        "--json", str(out)], env=_env(TILECOMM_CPU_KERNELS="triton"),
                       capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert r.returncode == 0, r.stderr[-2000:]
    rows = json.loads(out.read_text())
    assert rows[0]["case"] == "all_reduce/one_shot/sum/float32/heap/1K/w2"
    assert rows[0]["wrong"] == 0
    assert rows[0]["case"] in {t["case"] for t in res["records"] if t.get("part") == "kernel"}


DRIVER = """
import dataclasses, os, sys, json
os.environ["TRITON_INTERPRET"] = "1"
from tilecomm.bench import gpucheck


def setup(comm):
{setup}


cfg = gpucheck.config(True)
cfg.update({cfg})
res, code = gpucheck.run_check(cfg, {out!r}, setup=setup, log=lambda s: None)
rows = [c for c in res["records"] if "ok" in c]
print(json.dumps(dict(code=code, verdict=res["verdict"], summary=res["correctness_summary"],
                      rows=rows)))
"""

BROKEN = """
    # Two plausible launcher bugs, registered through the registry like any kernel:
    # all_reduce/one_shot reduces with max whatever op was asked; broadcast/direct ignores
    # the root (always broadcasts rank 0's data).
    from tilecomm.backends.triton import registry
    from tilecomm.types import ReduceOp
    registry.load()
    for key, bug in [(("all_reduce", "one_shot"), dict(op=ReduceOp.MAX)),
                     (("broadcast", "direct"), dict(root=0))]:
        spec = registry.KERNELS[key]

        def launch(ctx, call, spec=spec, bug=bug):
            spec.launch(ctx, dataclasses.replace(call, **bug))
        registry.KERNELS[key] = dataclasses.replace(spec, launch=launch)
"""

REORDERING = """
    # all_reduce/one_shot that sums in ring order (through the plan kernel on the ring
    # schedule): the right values on small integers, other bits on random floats at 3 ranks
    from tilecomm.backends.triton import registry
    from tilecomm.backends.triton.kernels.plan import launch_plan
    registry.load()
    key = ("all_reduce", "one_shot")
    spec = registry.KERNELS[key]

    def launch(ctx, call):
        launch_plan(ctx, dataclasses.replace(call, algo="ring"))
    registry.KERNELS[key] = dataclasses.replace(spec, launch=launch)
"""

RANK_1_ONLY = """
    # all_reduce/one_shot reduces with max on rank 1 only (the same kernel, signals and
    # calls on both ranks): rank 1 counts wrong elements, rank 0 sees none of its own
    from tilecomm.backends.triton import registry
    from tilecomm.types import ReduceOp
    registry.load()
    key = ("all_reduce", "one_shot")
    spec = registry.KERNELS[key]

    def launch(ctx, call, spec=spec, rank=comm.rank):
        spec.launch(ctx, dataclasses.replace(call, op=ReduceOp.MAX) if rank == 1 else call)
    registry.KERNELS[key] = dataclasses.replace(spec, launch=launch)
"""


def _drive(tmp_path, setup, **cfg):
    r = _py(DRIVER.format(setup=textwrap.indent(textwrap.dedent(setup), "    "),
                          cfg=repr(cfg), out=str(tmp_path)))
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads(r.stdout.strip().splitlines()[-1])


@pytest.mark.timeout(400)
def test_gpu_check_fails_when_a_kernel_is_wrong(tmp_path):
    got = _drive(tmp_path, BROKEN, phases=["correctness"],
                 kernels=["all_reduce/one_shot", "broadcast/direct", "all_gather/direct"])
    assert got["verdict"] == "FAIL" and got["code"] == 1, got
    s = got["summary"]
    assert not s["all_reduce/one_shot"]["ok"] and not s["broadcast/direct"]["ok"], s
    assert s["all_gather/direct"]["ok"], s
    assert any("wrong elements" in e for e in s["all_reduce/one_shot"]["errors"]), s
    with open(os.path.join(tmp_path, "gpu_check.txt")) as f:
        text = f.read()
    assert "RESULT: FAIL" in text and "FAIL all_reduce/one_shot" in text


@pytest.mark.timeout(400)
def test_bits_rows_catch_a_kernel_that_sums_in_another_order(tmp_path):
    """Integer data hides the reduction order; the bits rows (random floats, fused vs plan
    kernel vs rank-order reference) must not. At 3 ranks, a one_shot that sums in ring order
    passes every integer row and fails the bits rows, so the verdict is FAIL."""
    got = _drive(tmp_path, REORDERING, phases=["correctness", "bits"],
                 kernels=["all_reduce/one_shot"], worlds=[[3, "cpu"]])
    rows = [c for c in got["rows"] if str(c.get("kernel", "")).startswith("all_reduce/one_shot")]
    ints = [c["ok"] for c in rows if c.get("engine") == "fused"]
    bits = [c["ok"] for c in rows if c.get("engine") == "bits"]
    assert got["verdict"] == "FAIL" and got["code"] == 1, got
    assert bits and not all(bits), rows
    assert ints and all(ok is not False for ok in ints), rows


@pytest.mark.timeout(400)
def test_a_failure_on_one_rank_is_reported_with_that_ranks_error(tmp_path):
    """Rank 0 reports what rank 1 saw (an H200 run once said only "failed on another rank")."""
    got = _drive(tmp_path, RANK_1_ONLY, phases=["correctness"], kernels=["all_reduce/one_shot"])
    rows = [c for c in got["rows"] if c.get("kernel") == "all_reduce/one_shot"
            and c.get("engine") == "fused" and c.get("redop") == "sum" and c["ok"] is False]
    assert got["code"] == 1 and rows, got
    assert all(c["ranks_failed"] == [1] for c in rows), rows
    assert all(c["error"].startswith("failed on rank 1: ") and "wrong elements" in c["error"]
               for c in rows), rows


@pytest.mark.timeout(400)
def test_ranks_sharing_a_device_run_under_mps(tmp_path):
    """With MPS asked for (a fake control program here), the check starts the daemon, gives
    every rank its pipe directory and share of the GPU, and quits it after the world; here 3
    ranks run the MoE phase (normal, fp8 and low-latency against the reference)."""
    log = tmp_path / "mps_calls.jsonl"
    r, res = _run(tmp_path, "--worlds", "3", "--phases", "moe", "--mps", "on",
                  TILECOMM_MPS_CONTROL=FAKE_MPS, FAKE_MPS_LOG=str(log),
                  CUDA_MPS_PIPE_DIRECTORY=str(tmp_path / "none"))
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    mps = res["mps"]
    assert mps["status"] == "started" and mps["percentage"] == 33, mps
    env = res["rank_env"]["3"]
    assert env["CUDA_MPS_PIPE_DIRECTORY"] == mps["pipe_dir"]
    assert env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "33"
    assert env["NCCL_MULTI_RANK_GPU_ENABLE"] == "1"
    calls = [json.loads(x) for x in log.read_text().splitlines()]
    assert [c["argv"] for c in calls if c["argv"]] == [["-d"]]
    assert sum("quit" in c.get("commands", []) for c in calls) == 1
    assert not os.path.exists(os.path.dirname(mps["pipe_dir"]))
    assert "MPS: started" in r.stdout
    moe = [c for c in res["records"] if c["phase"] == "moe" and c.get("ok") is not None]
    assert len(moe) == 3 and all(c["ok"] for c in moe), moe


@pytest.mark.timeout(400)
def test_a_short_budget_cuts_cases_and_every_phase_has_its_turn(tmp_path):
    """A budget too short for the table (6 s, of which the correctness phase gets about 3.5 s:
    its cases take 4.5-6 s on 2 cores; with 8 s a fast run fitted them all): the cut cases are
    recorded as skipped, the later phase still runs (or is recorded as skipped), and the
    verdict is INCOMPLETE (exit 2)."""
    r, res = _run(tmp_path, "--phases", "correctness,sequence", "--budget", "6")
    assert r.returncode == 2, r.stdout[-3000:]
    assert res["verdict"] == "INCOMPLETE" and res["skipped_cases"] > 0
    cut = [c for c in res["records"] if c["phase"] == "correctness" and c["ok"] is None]
    assert cut and all(c["error"].startswith("skipped") for c in cut)
    assert [c["phase"] for c in res["records"]][-1] == "sequence"
    assert set(res["phase_times"]["sequence"]["2"]) == {"budget_s", "spent_s", "records"}


@pytest.mark.timeout(400)
def test_without_mps_ranks_sharing_a_device_get_correctness_only(tmp_path):
    """MPS asked for but it cannot start: the check says so and runs the checks alone (a
    timing in time slices would be the scheduler's quantum, not the kernels' speed)."""
    r, res = _run(tmp_path, "--phases", "sequence,timing,moe", "--mps", "on",
                  TILECOMM_MPS_CONTROL=FAKE_MPS, FAKE_MPS_FAIL="1",
                  FAKE_MPS_LOG=str(tmp_path / "calls.jsonl"),
                  CUDA_MPS_PIPE_DIRECTORY=str(tmp_path / "none"))
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert res["mps"]["status"] == "unavailable" and "exited with 1" in res["mps"]["reason"]
    assert set(res["phase_times"]) == {"sequence", "moe"}
    assert not [t for t in res["records"] if "ms" in t or "us" in t]
    assert any(c["phase"] == "moe" and c["ok"] for c in res["records"])
    assert "correctness only" in r.stdout and "MPS: unavailable" in r.stdout


def test_the_profile_reads_ncu_raw_csv_and_says_why_it_did_not_run(tmp_path):
    from tilecomm.bench.gpucheck import config, profile
    head = ['"ID"', '"Process ID"', '"Kernel Name"', f'"{profile.DRAM}"',
            f'"{profile.DURATION}"', f'"{profile.OCCUPANCY}"']
    text = "\n".join(["==PROF== Connected to process 1", ",".join(head),
                      '"","","","%","usecond","%"',
                      '"0","1","one_shot_all_reduce_kernel","45.2","12.5","30.1"',
                      '"1","1","moe_dispatch_push","71.0","1,250.0","12.5"'])
    got = profile.parse(text)
    assert got == [{"kernel": "one_shot_all_reduce_kernel", "duration": "12.5",
                    "dram_pct": "45.2", "occupancy_pct": "30.1"},
                   {"kernel": "moe_dispatch_push", "duration": "1,250.0", "dram_pct": "71.0",
                    "occupancy_pct": "12.5"}]
    assert profile.parse("no csv here") == []
    cfg = config(False)
    assert "not found" in profile.run(cfg, None, str(tmp_path), 60, str(tmp_path))["status"]
    assert profile.run(dict(cfg, profile=False), "ncu", str(tmp_path), 60,
                       str(tmp_path))["status"] == "off"
    assert "n/a" in profile.run(config(True), "ncu", str(tmp_path), 60, str(tmp_path))["status"]

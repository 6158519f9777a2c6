"""scripts/gpu_check.py --interpret: the GPU check's code path on CPU ranks (Triton interpreter),
so CI proves the script a lent GPU will run works. It runs tilecomm bench's case table (same
ids) over every registered kernel, dtype, reduction and memory kind, and it FAILS when a
registered kernel is wrong (a broken variant registered through the registry, not a hook)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
SCRIPT = os.path.join(ROOT, "scripts", "gpu_check.py")


def _env(**extra):
    env = {k: v for k, v in os.environ.items()
           if k not in ("TRITON_INTERPRET", "OUT", "TILECOMM_CPU_KERNELS")}
    env.update(extra)
    return env


def _py(code: str, timeout=60, **env):
    r = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], env=_env(**env),
                       capture_output=True, text=True, timeout=timeout, cwd=ROOT)
    return r


def _expected_table():
    """The correctness table gpu_check --interpret must run, built here from the registry."""
    r = _py(f"""
        import os, sys, json; os.environ['TRITON_INTERPRET'] = '1'
        sys.path.insert(0, {os.path.join(ROOT, 'scripts')!r})
        import gpu_check
        from tilecomm.backends.triton import registry
        from tilecomm.bench.cases import kernel_table
        c = gpu_check._config(True)
        ks = registry.load()
        from tilecomm.algorithms.registry import algorithms
        from tilecomm.bench.cases import CASES
        rows = kernel_table(ks, 2, c['check_sizes'], full_sizes=c['full_sizes'],
                            mix_mems=c['mix_mems'], cover=c['cover'])
        plans = {{(o, a): registry.plan_spec(o, a) for o in CASES for a in algorithms(o)}}
        rows += kernel_table(plans, 2, c['check_sizes'], full_sizes=c['plan_sizes'],
                             mix_mems=True, dtypes=['float32', 'bfloat16'],
                             redops=['sum', 'avg'], engine='plan')
        reg = {{f'{{o}}/{{a}}': [[str(d)[6:] for d in s.dtypes], list(s.ops)]
               for (o, a), s in ks.items()}}
        print(json.dumps([[x.id for x in rows], reg, [f'{{o}}/{{a}}' for o, a in plans]]))
        """)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout.strip().splitlines()[-1])


def _run(out, *extra, timeout=300):
    r = subprocess.run([sys.executable, SCRIPT, "--interpret", "--out", str(out), *extra],
                       env=_env(), capture_output=True, text=True, timeout=timeout, cwd=ROOT)
    with open(os.path.join(out, "gpu_check.json")) as f:
        return r, json.load(f)


@pytest.mark.timeout(400)      # ~35 s here; no wall-clock budget may skip a case (CI is slower)
def test_dry_run_passes_and_reports_the_case_table(tmp_path):
    ids, registered, schedules = _expected_table()
    r, res = _run(tmp_path)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert res["verdict"] == "PASS" and res["all_correct"] and res["skipped_cases"] == 0
    assert res["env"]["mode"] == "interpret" and res["worlds"] == {"2": "ok"}
    assert res["preflight"]["summary"] == "no GPU (interpret mode)"
    assert set(res["kernels"]) == set(registered) | {f"{k}/plan" for k in schedules}
    assert res["table"] == ids                           # the case table, by its ids
    by_case = {c["case"]: c for c in res["correctness"]}
    assert set(ids) <= set(by_case)
    for c in res["correctness"]:
        assert c["ok"] is True or c.get("applicable") is False, c
    # every dtype and reduction each kernel registers, staged and zero-copy memory
    for k, (dtypes, ops) in registered.items():
        mine = [c for c in res["correctness"] if c["kernel"] == k]
        assert {c["dtype"] for c in mine} == set(dtypes), k
        assert {c["mem"] for c in mine} == {"user", "heap"}, k
        if k.split("/")[0] in ("all_reduce", "reduce_scatter", "reduce"):
            assert {c["redop"] for c in mine} == set(ops), k
        rows = [t for t in res["timing"] if t["kernel"] == k]
        assert rows and all(t.get("us", 0) > 0 and not t.get("error") for t in rows), rows
    # the plan kernel: every registered schedule, fp32 and bf16, sum and avg, both memories
    for k in schedules:
        mine = [c for c in res["correctness"] if c["kernel"] == f"{k}/plan"]
        assert mine and all(c["case"].endswith("/plan") and c["engine"] == "plan"
                            for c in mine), k
        assert {c["dtype"] for c in mine} >= {"float32", "bfloat16"}, k
        assert {c["mem"] for c in mine} == {"user", "heap"}, k
        if k.split("/")[0] in ("all_reduce", "reduce_scatter", "reduce"):
            assert {c["redop"] for c in mine} >= {"sum", "avg"}, k
    # bits on random floats: every fused kernel of a reducing collective vs its plan twin
    bits = [c for c in res["correctness"] if c.get("engine") == "bits"]
    for k, (dtypes, ops) in registered.items():
        if k.split("/")[0] in ("all_reduce", "reduce_scatter", "reduce"):
            mine = [c for c in bits if c["kernel"] == f"{k}/bits"]
            assert {c["dtype"] for c in mine} == {"float32", "bfloat16", "float16"} & \
                set(dtypes), k
            assert {c["redop"] for c in mine} == {"sum", "avg"} & set(ops), k
            assert all(c["engines"] == ["fused", "plan"] for c in mine), k
    assert any(c["vs_reference"] for c in bits)
    det = [c for c in res["correctness"] if c["case"].endswith("/deterministic")]
    assert len(det) == 1 and det[0]["ok"] and det[0]["algo_auto"] == "two_shot", det
    seq = [c for c in res["correctness"] if c["case"].startswith("sequence/")]
    assert seq and seq[0]["ok"] and len(seq[0]["calls"]) >= 6
    assert len({c.split("/")[0] for c in seq[0]["calls"]}) >= 3     # different operations
    # the fused ops (scripts/gpu_check_overlap.py): both copy variants and the reduce-scatter
    # against the references in fp32 and bf16, timed against unfused; no PyTorch baseline here
    ops = {(c["kernel"], c["dtype"]): c for c in res["correctness"]
           if c["kernel"].startswith("ops/")}
    assert set(ops) == {(f"ops/{k}", d) for k in ("all_gather_matmul/kernel",
                                                   "all_gather_matmul/stream",
                                                   "matmul_reduce_scatter")
                        for d in ("float32", "bfloat16")}, sorted(ops)
    assert all(c["ok"] and c["max_abs_diff"] < 1e-3 for c in ops.values()), ops
    ov = {t["op"]: t for t in res["overlap"]}
    assert set(ov["all_gather_matmul"]["us"]) == {"fused copy=kernel", "fused copy=stream",
                                                  "unfused all_gather + matmul"}, ov
    assert set(ov["matmul_reduce_scatter"]["us"]) == {"fused",
                                                      "unfused matmul + reduce_scatter"}, ov
    assert all(v > 0 for t in ov.values() for v in t["us"].values())
    assert ov["all_gather_matmul"]["faster_copy"] in ("fused copy=kernel", "fused copy=stream")
    assert all("n/a" in t["errors"]["torch symm_mem fused"] for t in ov.values()), ov
    assert res["copy_bandwidth"]["GBps"] > 0
    lat = res["latency_8k"]["us_slowest_rank"]
    assert all(isinstance(v, float) and v > 0 for v in lat.values()), lat
    assert "n/a" in res["graph_8k"]["error"]           # no CUDA graphs in the interpreter
    with open(os.path.join(tmp_path, "gpu_check.txt")) as f:
        text = f.read()
    assert "RESULT: PASS" in text and text.strip() in r.stdout
    assert "preflight: no GPU (interpret mode)" in text
    assert "faster all-gather copy:" in text


def test_case_ids_are_tilecomm_bench_ids(tmp_path):
    """The bench on the kernel path names its rows as gpu_check's table does."""
    _, res = _run(tmp_path, "--kernels", "all_reduce/one_shot")
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
    assert rows[0]["case"] in res["timing_table"]
    assert {t["case"] for t in res["timing"]} == set(res["timing_table"])


DRIVER = """
import dataclasses, os, sys, json
os.environ["TRITON_INTERPRET"] = "1"
sys.path.insert(0, {scripts!r})
import gpu_check


def register_broken_kernels(comm):
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


cfg = gpu_check._config(True)
cfg["kernels"] = ["all_reduce/one_shot", "broadcast/direct", "all_gather/direct"]
res, code = gpu_check.run_check(cfg, {out!r}, rank_setup=register_broken_kernels,
                                log=lambda s: None)
print(json.dumps(dict(code=code, verdict=res["verdict"],
                      summary=res["correctness_summary"])))
"""


@pytest.mark.timeout(400)
def test_gpu_check_fails_when_a_kernel_is_wrong(tmp_path):
    r = _py(DRIVER.format(scripts=os.path.join(ROOT, "scripts"), out=str(tmp_path)),
            timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    got = json.loads(r.stdout.strip().splitlines()[-1])
    assert got["verdict"] == "FAIL" and got["code"] == 1, got
    s = got["summary"]
    assert not s["all_reduce/one_shot"]["ok"] and not s["broadcast/direct"]["ok"], s
    assert s["all_gather/direct"]["ok"], s
    assert any("wrong elements" in e for e in s["all_reduce/one_shot"]["errors"]), s
    with open(os.path.join(tmp_path, "gpu_check.txt")) as f:
        text = f.read()
    assert "RESULT: FAIL" in text and "FAIL all_reduce/one_shot" in text



ORDER_DRIVER = """
import dataclasses, os, sys, json
os.environ["TRITON_INTERPRET"] = "1"
sys.path.insert(0, {scripts!r})
import gpu_check


def register_reordering_kernel(comm):
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


cfg = gpu_check._config(True)
cfg["kernels"] = ["all_reduce/one_shot"]
cfg["worlds"] = [[3, "cpu"]]
res, code = gpu_check.run_check(cfg, {out!r}, rank_setup=register_reordering_kernel,
                                log=lambda s: None)
rows = [c for c in res["correctness"]
        if str(c.get("kernel", "")).startswith("all_reduce/one_shot")]
print(json.dumps(dict(code=code, verdict=res["verdict"],
                      ints=[c["ok"] for c in rows if c.get("engine") == "fused"],
                      bits=[c["ok"] for c in rows if c.get("engine") == "bits"],
                      errors=[c.get("error") for c in rows if c.get("ok") is False][:3])))
"""


@pytest.mark.timeout(400)
def test_gpu_check_bits_rows_catch_a_kernel_that_sums_in_another_order(tmp_path):
    """Integer data hides the reduction order; the bits rows (random floats, fused vs plan
    kernel vs rank-order reference) must not. At 3 ranks, a one_shot that sums in ring order
    passes every integer row and fails the bits rows, so the verdict is FAIL."""
    r = _py(ORDER_DRIVER.format(scripts=os.path.join(ROOT, "scripts"), out=str(tmp_path)),
            timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    got = json.loads(r.stdout.strip().splitlines()[-1])
    assert got["verdict"] == "FAIL" and got["code"] == 1, got
    assert got["bits"] and not all(got["bits"]), got
    assert got["ints"] and all(ok is not False for ok in got["ints"]), got


ONE_RANK_DRIVER = """
import dataclasses, os, sys, json
os.environ["TRITON_INTERPRET"] = "1"
sys.path.insert(0, {scripts!r})
import gpu_check


def break_rank_1(comm):
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


cfg = gpu_check._config(True)
cfg["kernels"] = ["all_reduce/one_shot"]
res, code = gpu_check.run_check(cfg, {out!r}, rank_setup=break_rank_1, log=lambda s: None)
rows = [c for c in res["correctness"] if c.get("kernel") == "all_reduce/one_shot"
        and c.get("engine") == "fused" and c.get("redop") == "sum"]
print(json.dumps(dict(code=code, errors=[c.get("error") for c in rows if c.get("ok") is False],
                      ranks=[c.get("ranks_failed") for c in rows if c.get("ok") is False])))
"""


@pytest.mark.timeout(400)
def test_a_failure_on_one_rank_is_reported_with_that_ranks_error(tmp_path):
    """Rank 0 reports what rank 1 saw (the H200 run said only "failed on another rank")."""
    r = _py(ONE_RANK_DRIVER.format(scripts=os.path.join(ROOT, "scripts"), out=str(tmp_path)),
            timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    got = json.loads(r.stdout.strip().splitlines()[-1])
    assert got["code"] == 1 and got["errors"], got
    assert all(r == [1] for r in got["ranks"]), got
    assert all(e.startswith("failed on rank 1: ") and "wrong elements" in e
               for e in got["errors"]), got

"""scripts/gpu_check.py --interpret: the GPU check's code path on CPU ranks (Triton interpreter),
so CI proves the script a lent GPU will run works: one correctness entry per registered kernel,
all passing, a timing row per kernel, and a failing kernel reported without stopping the rest."""

from __future__ import annotations

import json
import os
import subprocess
import sys

ROOT = os.path.join(os.path.dirname(__file__), "..", "..")
SCRIPT = os.path.join(ROOT, "scripts", "gpu_check.py")


def _env():
    return {k: v for k, v in os.environ.items() if k not in ("TRITON_INTERPRET", "OUT")}


def _registered() -> set[str]:
    code = ("import os; os.environ['TRITON_INTERPRET'] = '1'\n"
            "from tilecomm.backends.triton import registry\n"
            "print(' '.join(f'{c}/{a}' for c, a in sorted(registry.load())))")
    r = subprocess.run([sys.executable, "-c", code], env=_env(), capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    return set(r.stdout.split())


def _run(out, *extra, timeout=60):
    r = subprocess.run([sys.executable, SCRIPT, "--interpret", "--out", str(out), *extra],
                       env=_env(), capture_output=True, text=True, timeout=timeout, cwd=ROOT)
    with open(os.path.join(out, "gpu_check.json")) as f:
        return r, json.load(f)


def test_dry_run_checks_every_registered_kernel(tmp_path):
    kernels = _registered()
    assert {"all_to_all/pairwise", "all_to_all_v/pairwise", "broadcast/direct"} <= kernels
    r, res = _run(tmp_path)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert res["env"]["mode"] == "interpret" and res["worlds"] == {"2": "ok"}
    assert set(res["kernels"]) == kernels
    seen = {c["kernel"] for c in res["correctness"]}
    assert seen == kernels
    for c in res["correctness"]:
        assert c["ok"] is True, c
    for k in kernels:
        s = res["correctness_summary"][k]
        assert s["ok"] and s["worlds"]["2"]["run"] >= 2, (k, s)
        rows = [t for t in res["timing"] if t["kernel"] == k]
        assert rows and all(t.get("us", 0) > 0 and not t.get("error") for t in rows), rows
    assert res["copy_bandwidth"]["GBps"] > 0
    lat = res["latency_8k"]["us_slowest_rank"]
    assert all(isinstance(v, float) and v > 0 for v in lat.values()), lat
    with open(os.path.join(tmp_path, "gpu_check.txt")) as f:
        text = f.read()
    assert "RESULT: all kernels correct" in text and text.strip() in r.stdout


def test_dry_run_reports_a_broken_kernel_and_goes_on(tmp_path):
    r, res = _run(tmp_path, "--kernels", "broadcast/direct,all_to_all/pairwise",
                  "--break", "all_to_all/pairwise")
    assert r.returncode == 1, r.stdout[-3000:] + r.stderr[-3000:]
    s = res["correctness_summary"]
    assert not s["all_to_all/pairwise"]["ok"] and s["broadcast/direct"]["ok"], s
    bad = [c for c in res["correctness"] if c["kernel"] == "all_to_all/pairwise"]
    assert bad and all(c["ok"] is False and c["ranks_failed"] == [0] and "wrong" in c["error"]
                       for c in bad), bad
    assert not res["all_correct"] and "FAIL all_to_all/pairwise" in r.stdout

"""PyTorch's own distributed test suite, fast selection, against tilecomm and Gloo (CI).

Runs ``run_suite.py --select fast`` (the collectives the issue names: all_reduce, broadcast,
reduce, all_gather, gather, scatter, all_to_all(_single), send/recv, barrier, coalesced and
object variants, groups) in a subprocess for each backend, with forked ranks so that a test
costs well under a second, and asserts:

* with tilecomm every selected test passes or skips for a reason listed in ``SKIP_REASONS``
  (the reasons docs/compatibility.md explains);
* every test that passes with Gloo passes with tilecomm;
* nothing is left behind: no shared-memory file, no rank process.

The full suite is run by hand (see docs/compatibility.md); this keeps CI under ~90 s.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest

import tilecomm
from shm_files import tilecomm_files

RUNNER = Path(__file__).with_name("run_suite.py")
TIMEOUT_S = 240  # a whole run; each test has its own limit (--timeout) inside

# The module fixture runs everything (~40 s on 2 cores) inside the first test's setup.
pytestmark = [pytest.mark.timeout(900), pytest.mark.slow]

#: Skips that are not tilecomm's doing, with why they are skips (see docs/compatibility.md).
SKIP_REASONS = {
    r"^Skipped due to small world size\.$":
        "upstream runs the '_group' variants (group [1, 2]) only at world size >= 8",
    r"^Test requires (an exact )?world size of \d+$":
        "the test is written for another world size",
    r"^Test is failing, see https://github\.com/pytorch/pytorch/pull/113620$":
        "disabled upstream for every backend",
}

#: Failures reported to the backend's author and not fixed yet: test -> the exception line.
#: They make the tests below xfail instead of fail; one that passes again must be removed.
KNOWN_FAILURES: dict[str, str] = {}

# `--select fast` picks by world size: the main selection at 2 ranks, proper sub-groups and
# gather_object at 4, the '_group' variants (group [1, 2], run upstream only at >= 8) at 8.
WORLD_SIZES = (2, 4, 8)


def _tilecomm_env() -> dict[str, str]:
    env = dict(os.environ)
    # The ranks must import the same tilecomm as this process.
    src = str(Path(tilecomm.__file__).resolve().parents[1])
    env["PYTHONPATH"] = os.pathsep.join(p for p in (src, env.get("PYTHONPATH")) if p)
    env.pop("TILECOMM_SHM_DIR", None)  # the runner uses a private one
    return env


def _start(backend: str, world_size: int, out: Path) -> subprocess.Popen:
    cmd = [sys.executable, str(RUNNER), "--backend", backend, "--world-size", str(world_size),
           "--select", "fast", "--start-method", "fork", "--timeout", "60", "--json", str(out)]
    # Own session: on a timeout the runner and every rank it forked are killed together.
    return subprocess.Popen(cmd, env=_tilecomm_env(), stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)


def _finish(proc: subprocess.Popen, what: str, out: Path) -> dict:
    try:
        log, _ = proc.communicate(timeout=TIMEOUT_S)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        log, _ = proc.communicate()
        pytest.fail(f"{what} timed out after {TIMEOUT_S} s:\n{log[-4000:]}")
    if not out.exists():
        pytest.fail(f"{what} wrote no results (exit {proc.returncode}):\n{log[-4000:]}")
    data = json.loads(out.read_text())
    data["log"] = log
    return data


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("torch_suite")
    shm_before = tilecomm_files("/dev/shm")
    res: dict[str, list[dict]] = {"tilecomm": [], "gloo": []}
    for ws in WORLD_SIZES:
        # The two backends side by side: a test mostly waits (the suite's file barrier polls
        # every 0.1 s), so this halves the wall time; no test depends on being alone.
        procs = {b: _start(b, ws, tmp / f"{b}-{ws}.json") for b in res}
        try:
            for b, proc in procs.items():
                res[b].append(_finish(proc, f"{b} at world size {ws}", tmp / f"{b}-{ws}.json"))
        finally:
            for proc in procs.values():
                if proc.poll() is None:
                    os.killpg(proc.pid, signal.SIGKILL)
                    proc.wait()
    res["shm_new"] = sorted(tilecomm_files("/dev/shm") - shm_before)
    return res


def _tests(runs: list[dict]) -> dict[str, dict]:
    out = {}
    for run in runs:
        ws = run["meta"]["world_size"]
        out.update({f"{name}[ws={ws}]": rec for name, rec in run["tests"].items()})
    return out


def _documented(rec: dict) -> bool:
    reasons = [rec.get("reason", "")] + rec.get("also_skipped_for", [])
    return any(re.search(p, r) for p in SKIP_REASONS for r in reasons)


def _bare(name: str) -> str:
    return name.split("[", 1)[0]


def _check_known(failed: dict[str, str], tests: dict[str, dict]) -> None:
    """Fail on a failure not in KNOWN_FAILURES or a known one that passes; xfail on the rest."""
    new = {n: why for n, why in failed.items() if _bare(n) not in KNOWN_FAILURES}
    assert not new, "tilecomm fails tests of PyTorch's suite:\n" + "\n".join(
        f"  {n}: {why}" for n, why in new.items())
    fixed = sorted({_bare(n) for n, r in tests.items() if r["status"] == "passed"}
                   & set(KNOWN_FAILURES) - {_bare(n) for n in failed})
    assert not fixed, f"these pass now, remove them from KNOWN_FAILURES: {fixed}"
    if failed:
        pytest.xfail("known failures: " + "; ".join(f"{n}: {w[:80]}" for n, w in failed.items()))


def test_tilecomm_passes_fast_selection(results):
    tests = _tests(results["tilecomm"])
    assert len(tests) >= 60
    odd = {n: r.get("reason", "") for n, r in tests.items()
           if r["status"] == "skipped" and not _documented(r)}
    assert not odd, f"skipped for reasons docs/compatibility.md does not explain: {odd}"
    passed = [n for n, r in tests.items() if r["status"] == "passed"]
    assert len(passed) >= 50
    failed = {n: r.get("reason", "") for n, r in tests.items() if r["status"] == "failed"}
    _check_known(failed, tests)


def test_every_gloo_pass_is_a_tilecomm_pass(results):
    gloo, tc = _tests(results["gloo"]), _tests(results["tilecomm"])
    assert not [n for n, r in gloo.items() if r["status"] == "failed"], "Gloo fails"
    gloo_passed = {n for n, r in gloo.items() if r["status"] == "passed"}
    assert len(gloo_passed) >= 50  # the comparison means something
    missing = {n: tc.get(n, {}).get("reason", tc.get(n, {}).get("status", "not run"))
               for n in sorted(gloo_passed) if tc.get(n, {}).get("status") != "passed"}
    _check_known(missing, tc)


def test_nothing_left_behind(results):
    for backend in ("tilecomm", "gloo"):
        for run in results[backend]:
            assert not run["meta"]["shm_leaked"], (backend, run["meta"]["shm_leaked"])
            assert not run["meta"]["leftover_processes"], (backend,
                                                           run["meta"]["leftover_processes"])
    assert not results["shm_new"], f"new files in /dev/shm: {results['shm_new']}"

"""``tilecomm bench --hosts`` and the rank-side helpers of the across-hosts benchmarks
(``tilecomm.bench.hosts_group``, ``cpu_accounting``, ``local_steps``) on 2 simulated hosts x 2
ranks: the bench checks its results and times Gloo flat in the same run; the helpers
(``cpu_accounting``, ``local_steps``) return one positive timing per rank that takes part."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tilecomm import simhosts

pytestmark = [pytest.mark.multihost, pytest.mark.slow]


@pytest.fixture(autouse=True)
def _needs_namespaces():
    reason = simhosts.available()
    if reason:
        pytest.skip(f"simulated hosts unavailable here: {reason}")


def test_bench_on_simulated_hosts_checks_results_and_times_gloo(tmp_path):
    out = tmp_path / "rows.json"
    proc = subprocess.run(
        [sys.executable, "-m", "tilecomm.cli", "bench", "all_reduce", "-n", "4", "--hosts", "2",
         "-b", "64", "-e", "256K", "-f", "64", "--iters", "2", "--warmup", "1", "--rounds", "1",
         "--vs", "gloo", "--check", "--no-bound", "--json", str(out)],
        capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    rows = json.loads(out.read_text())
    assert [r["bytes"] for r in rows] == [64, 4096, 262144]
    for r in rows:
        assert r["world_size"] == 4 and r["wrong"] == 0, r
        assert r["algo"].startswith("hier_"), r          # auto picks a hierarchical schedule
        assert r["time_us"] > 0 and r["gloo_time_us"] > 0 and r["x_gloo"] > 0, r


def test_accounting_helpers_time_every_primitive_on_every_rank():
    from tilecomm.bench.cpu_accounting import cpu_per_call, primitive_time
    from tilecomm.bench.hosts_group import HostsGroup
    from tilecomm.bench.local_steps import time_local, time_rail_after_local

    # (the ranks unpickle functions by reference: only importable ones, not this module's)
    with HostsGroup([2, 2], timeout=60) as g:
        for what in ("copy", "add", "tcp"):
            t = g.run(primitive_time, 4096, 2, what)
            assert len(t) == 4 and all(x > 0 for x in t), (what, t)
        for which in ("gloo", "tilecomm", "tilecomm:hier_rail"):
            res = g.run(cpu_per_call, 4096, 2, which)
            assert len(res) == 4 and all(w > 0 and c > 0 for w, c in res), (which, res)
        with pytest.raises(Exception, match="unknown primitive"):
            g.run(primitive_time, 4096, 2, "nope")
        # benchmarks/hosts_local.py's rows: a local step, and a rail round after one
        per_rank = g.run(time_local, "reduce_scatter", 4096, 3)
        assert len(per_rank) == 4 and all(len(t) == 3 and min(t) > 0 for t in per_rank)
        both = g.run(time_rail_after_local, 4224, 3, "both")
        assert all(min(t) > 0 for t in both)
        one = g.run(time_rail_after_local, 4224, 3, "one")      # rail 0: ranks 0 and 2
        assert [min(t) > 0 for t in one] == [True, False, True, False]

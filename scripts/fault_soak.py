"""Fault soak: random checked calls, a rank killed or stopped, shrink, grow back; repeated.

    python scripts/fault_soak.py --world 6 --rounds 300               # one host
    python scripts/fault_soak.py --hosts 2 --per-host 2 --jobs 10      # 2 simulated hosts

One host: ``--rounds`` rounds on ``--world`` local ranks (tilecomm.fault_soak: each round's
calls, victim, failure and grow are drawn from the seed). Simulated hosts: ``--jobs`` torchrun
jobs; in each, the last host is lost at a random point and the survivors shrink past it and run
the remaining rounds. Prints the figures as JSON: rounds, calls checked (summed over members),
wrong results and errors (both must be empty), hangs (must be 0), tilecomm files left in
/dev/shm (must be 0), and the time from a failure to a working shrunk communicator (median and
max, by kind of failure). Exits 1 when any of those is not as it must be.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time

from tilecomm import fault_soak, simhosts


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--world", type=int, default=4, help="ranks on one host (default 4)")
    ap.add_argument("--rounds", type=int, default=100, help="rounds per run (default 100)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--calls", type=int, default=12, help="most calls per round (default 12)")
    ap.add_argument("--timeout", type=float, default=1.0,
                    help="the communicators' wait bound in s: how long a stopped rank takes "
                         "to be noticed (default 1)")
    ap.add_argument("--hosts", type=int, default=0, help="simulated hosts (0: one host)")
    ap.add_argument("--per-host", type=int, default=2, help="ranks per simulated host")
    ap.add_argument("--jobs", type=int, default=5, help="torchrun jobs (--hosts; default 5)")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--run-dir", help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.worker:                # a rank under torchrun
        fault_soak.across_hosts(a.seed, a.rounds, a.run_dir, a.timeout, a.calls)
        return 0
    if a.hosts:
        res = _hosts(a)
    else:
        with tempfile.TemporaryDirectory(prefix="tilecomm-fault-soak-") as d:
            res = fault_soak.run(a.world, a.rounds, a.seed, timeout=a.timeout, calls=a.calls,
                                 run_dir=d)
    print(json.dumps(res, indent=1))
    bad = res["wrong"] or res["errors"] or res["hangs"] or res["left_in_shm"] or \
        res["rounds"] < res["requested"]
    return 1 if bad else 0


def _hosts(a) -> dict:
    per_host = [a.per_host] * a.hosts
    t0 = time.monotonic()
    total: dict = {"wrong": [], "errors": [], "hangs": 0, "left_in_shm": 0, "rounds": 0,
                   "calls": 0, "hosts_lost": 0, "recovery": []}
    for job in range(a.jobs):
        with tempfile.TemporaryDirectory(prefix="tilecomm-fault-soak-") as d:
            argv = [os.path.abspath(__file__), "--worker", "--run-dir", d, "--seed",
                    str(a.seed * 1000 + job), "--rounds", str(a.rounds), "--calls",
                    str(a.calls), "--timeout", str(a.timeout)]
            run = simhosts.run(per_host, argv, timeout=a.rounds * (3 * a.timeout + 5) + 60,
                               capture=True, keep_going=True)
            res = fault_soak.summarize([], d)
        total["hangs"] += int(run.timed_out)
        if run.codes[0] != 0:
            total["errors"].append(f"job {job}: the surviving host exited with "
                                   f"{run.codes[0]}:\n{run.output[-3000:]}")
        for k in ("wrong", "errors"):
            total[k] += res[k]
        for k in ("left_in_shm", "calls", "hosts_lost"):
            total[k] += res[k]
        total["rounds"] += res["rounds"]
        total["recovery"] += res["recovery_host_times"]
    rec = sorted(total.pop("recovery"))
    total.update(requested=a.rounds * a.jobs, jobs=a.jobs, per_host=per_host,
                 recovery_host_s=fault_soak.stats(rec) if rec else None,
                 seconds=time.monotonic() - t0)
    return total


if __name__ == "__main__":
    sys.exit(main())

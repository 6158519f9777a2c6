"""Local steps of hierarchical calls on simulated hosts, timed alone (calibration).

Stays a script: its rows are pieces of hierarchical calls (a local step right after a rail
round, and the converse) on simulated hosts (namespaces), calibration input for
``tilecomm.sim.hosts``, not whole calls the bench could time as cases.

``tilecomm.sim.hosts`` takes a Local step's cost from the single-host model, which is fitted
on 2 ranks with a core each. Inside a hierarchical call on 2 simulated hosts x 2 ranks, the
step runs with the other host's ranks busy at the same time (4 processes on this machine's 2
cores) and right after an inter-host round. This script measures exactly that, for the local
collectives the hierarchical plans use (``tilecomm.bench.local_steps``), so the model can fit
a wake-up cost and a slow-down factor on it and still *predict* the hierarchical bench rows out
of sample (they are not used here). It also times the converse: a rail round (the rails' own
pairwise Gloo round, header-sized and larger) right after a local step; the model takes its
median excess over the back-to-back link fit (``benchmarks/hosts_link.py``) as the rail's
wake-up.

    PYTHONPATH=src python benchmarks/hosts_local.py --json benchmarks/results/hosts_local_2x2.json

Rows: ``{"collective", "bytes", "time_us", "iters"}``, and ``rail_rows``: ``{"mode", "bytes",
"time_us", "iters"}``; ``time_us`` is the median over iterations of the slowest rank's call;
the file records the load average before and after.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from pathlib import Path

COLLECTIVES = ("reduce_scatter", "all_gather", "reduce", "broadcast", "all_reduce")
SIZES = (64, 4 << 10, 64 << 10, 1 << 20, 8 << 20)
#: rail rounds right after a local step: the header block (hier/rails.py ROUND1) and payloads
RAIL_SIZES = (4224, 32 << 10, 256 << 10, 2 << 20)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", default="benchmarks/results/hosts_local_2x2.json")
    ap.add_argument("--hosts", type=int, default=2)
    ap.add_argument("--per-host", type=int, default=2)
    ap.add_argument("--iters", type=int, default=25)
    ap.add_argument("--sizes", default=",".join(map(str, SIZES)), help="bytes, comma separated")
    a = ap.parse_args(argv)
    from tilecomm.bench.hosts_group import HostsGroup
    from tilecomm.bench.local_steps import time_local, time_rail_after_local

    up0 = os.getloadavg()
    rows = []
    with HostsGroup([a.per_host] * a.hosts, timeout=120) as g:
        for coll in COLLECTIVES:
            for n in (int(s) for s in a.sizes.split(",")):
                per_rank = g.run(time_local, coll, n, a.iters)
                slowest = [max(t[i] for t in per_rank) for i in range(a.iters)]
                rows.append({"collective": coll, "bytes": n, "iters": a.iters,
                             "time_us": 1e6 * statistics.median(slowest[1:])})
                print(f"{coll:15s} {n:>10d} B  {rows[-1]['time_us']:10.1f} us", flush=True)
        rail_rows = []
        for mode in ("both", "one"):
            for n in RAIL_SIZES:
                per_rank = g.run(time_rail_after_local, n, a.iters, mode)
                slowest = [max(t[i] for t in per_rank) for i in range(a.iters)]
                rail_rows.append({"mode": mode, "bytes": n, "iters": a.iters,
                                  "time_us": 1e6 * statistics.median(slowest[1:])})
                print(f"rail after local {mode:4s} {n:>10d} B  {rail_rows[-1]['time_us']:10.1f} us",
                      flush=True)
    up1 = os.getloadavg()
    data = {"rows": rows, "rail_rows": rail_rows, "hosts": a.hosts, "per_host": a.per_host,
            "cpus": os.cpu_count(),
            "loadavg_before": up0, "loadavg_after": up1,
            "command": "PYTHONPATH=src python benchmarks/hosts_local.py " +
                       " ".join(argv if argv is not None else sys.argv[1:])}
    Path(a.json).write_text(json.dumps(data, indent=1) + "\n")
    print(f"wrote {len(rows)} rows to {a.json} (load {up0[0]:.2f} -> {up1[0]:.2f})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

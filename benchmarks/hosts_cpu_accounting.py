"""CPU accounting of all_reduce across 2 simulated hosts x 2 ranks, tilecomm against Gloo flat.

Stays a script: it reads process CPU time and /proc/stat around the calls on simulated hosts
(namespaces), which the bench's rows (wall time per round) do not carry.

    PYTHONPATH=src python benchmarks/hosts_cpu_accounting.py [--sizes 1M,16M] [--repeats 2]
        [--algos auto,hier_rail,hier_leader]

Per size and repeat: wall time per back-to-back call (slowest rank), CPU time per call per rank
(process CPU, Gloo's threads included) and how busy the whole machine was (/proc/stat) while
the calls ran. 4 ranks on this machine's 2 cores: when the machine is ~90% busy, speed is set
by the CPU work per call, and a faster all_reduce has to do less of it.
"""

from __future__ import annotations

import argparse

from tilecomm.units import parse_size


def _busy() -> tuple[int, int]:
    with open("/proc/stat") as f:
        v = [int(x) for x in f.readline().split()[1:]]
    return sum(v), v[3] + v[4]          # all jiffies, idle + iowait


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="1M,16M")
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--algos", default="auto", help="tilecomm algorithms, comma separated")
    a = ap.parse_args(argv)
    from tilecomm.bench.cpu_accounting import cpu_per_call
    from tilecomm.bench.hosts_group import HostsGroup

    print(f"{'size':>6} {'who':>20} {'wall us':>9} {'cpu us/rank':>12} {'machine busy':>13}")
    with HostsGroup([2, 2], timeout=120) as g:
        for s in a.sizes.split(","):
            n = parse_size(s)
            iters = max(10, min(200, (64 << 20) // max(n, 1)))
            for _ in range(a.repeats):
                for who in [f"tilecomm:{x}" for x in a.algos.split(",")] + ["gloo"]:
                    b0 = _busy()
                    res = g.run(cpu_per_call, n, iters, who)
                    b1 = _busy()
                    busy = 1 - (b1[1] - b0[1]) / max(b1[0] - b0[0], 1)
                    wall = max(r[0] for r in res)
                    cpu = sum(r[1] for r in res) / len(res)
                    print(f"{s:>6} {who:>20} {wall:>9.0f} {cpu:>12.0f} {busy:>12.0%}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

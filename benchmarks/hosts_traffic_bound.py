"""How fast can a hierarchical all_reduce be on 2 simulated hosts x 2 ranks, against Gloo's
flat ring? A bound from the cost of the bytes each must move, measured on this machine.

Stays a script: it times per-byte primitives (copy, add, TCP) on simulated hosts
(namespaces), predicts Gloo's and a hierarchical all_reduce's time from them, and sets the
prediction beside both measured on the same hosts; the bench's rows carry no such model.

    PYTHONPATH=src python benchmarks/hosts_traffic_bound.py [--sizes 4M,16M,64M] [--repeats 3]

Every rank runs one primitive at once (4 ranks on this machine's cores, as in the collectives),
and we time it per byte: a local copy, a local add (c = a + b), and a TCP exchange with the rail
partner on the other host (Gloo send and receive on the rail group, both rails at once). The
simulated hosts share one machine, so bytes sent over loopback TCP are copied twice by the
kernel (into the socket, out of it) on the same cores and memory as the local copies.

Work per rank for an all_reduce of N bytes, counting only what cannot be avoided:

* Gloo flat ring over 4 ranks: sends 1.5 N (and receives as much), adds 0.75 N.
* Hierarchical of hier_rail's structure (reduce_scatter in the host, all_reduce of the halves on
  the rails, all_gather in the host), with nothing staged: adds N/2 in the host, sends N/2 to the other host, adds N/2
  there, and copies N into its output (its own half from the shared buffer the peer also reads,
  the peer's half). Staging a private input's half for the peer adds N/2 copied; that is what
  ordinary (non-heap) tensors need on CPU, where a process cannot read another's memory.

So ``T_gloo ~ 1.5 N t_tcp + 0.75 N t_add`` and ``T_hier >= 0.5 N t_tcp + N t_add + N t_copy``,
and their ratio bounds the speedup of an algorithm of that structure here. The script prints the
prediction for Gloo next to Gloo measured in the same run (how far the per-byte costs account
for the real collective), tilecomm's auto measured, and the bound.
"""

from __future__ import annotations

import argparse
import statistics

from tilecomm.units import parse_size


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="4M,16M,64M")
    ap.add_argument("--repeats", type=int, default=3)
    a = ap.parse_args(argv)
    from tilecomm.bench.cpu_accounting import cpu_per_call, primitive_time
    from tilecomm.bench.hosts_group import HostsGroup

    print(f"{'size':>5} {'copy us':>8} {'add us':>8} {'tcp us':>8} | {'Gloo pred':>9} "
          f"{'Gloo':>8} {'tilecomm':>8} | {'bound':>5} {'bound staged':>12} "
          f"{'tilecomm x Gloo':>15}")
    with HostsGroup([2, 2], timeout=300) as g:
        for s in a.sizes.split(","):
            n = parse_size(s)
            iters = max(5, min(100, (256 << 20) // n))
            rows = []
            for _ in range(a.repeats):
                t = {w: max(g.run(primitive_time, n, iters, w)) for w in ("copy", "add", "tcp")}
                t["gloo"] = max(r[0] for r in g.run(cpu_per_call, n, iters, "gloo"))
                t["tc"] = max(r[0] for r in g.run(cpu_per_call, n, iters, "tilecomm"))
                rows.append(t)
            m = {k: statistics.median(r[k] for r in rows) for k in rows[0]}
            gloo_pred = 1.5 * m["tcp"] + 0.75 * m["add"]
            hier = 0.5 * m["tcp"] + m["add"] + m["copy"]
            staged = hier + 0.5 * m["copy"]
            print(f"{s:>5} {m['copy']:>8.0f} {m['add']:>8.0f} {m['tcp']:>8.0f} | "
                  f"{gloo_pred:>9.0f} {m['gloo']:>8.0f} {m['tc']:>8.0f} | "
                  f"{m['gloo'] / hier:>5.2f} {m['gloo'] / staged:>12.2f} "
                  f"{m['gloo'] / m['tc']:>15.2f}", flush=True)
    print("bound: Gloo measured / T_hier lower bound (nothing staged); bound staged: with the "
          "N/2 staging copy of ordinary tensors; medians of the repeats")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

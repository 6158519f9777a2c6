"""The CPU executor's native runner against its Python path, in the same processes.

    python benchmarks/native_vs_python.py -n 2 --sizes 8 4K 256K 2M 16M [--json out.json]

Per size and engine (switched on the executor between rounds, so both see the same machine
state): warm-up, then ``--rounds`` rounds of back-to-back ``comm.all_reduce`` (float32, auto
algorithm, an ordinary tensor) after a barrier; a round's time is the slowest rank's mean; the
median round is reported. Both engines run the same plans and give the same bits
(tests/runtime/test_native_runner.py); this measures only what the runner saves.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

import torch

import tilecomm
from tilecomm.backends.cpu import native
from tilecomm.units import format_size, parse_size


def _work(comm, sizes, rounds):
    ex = comm.host.backend.executor
    rows = []
    for nbytes in sizes:
        x = torch.ones(max(1, nbytes // 4))
        iters = max(20, min(2000, int(1e8 // max(nbytes, 1))))
        row = {}
        for name, use_native in (("native", True), ("python", False)):
            ex.native = use_native
            for _ in range(5):
                comm.all_reduce(x)
            times = []
            for _ in range(rounds):
                x.fill_(1)
                comm.barrier()
                t0 = time.perf_counter()
                for _ in range(iters):
                    comm.all_reduce(x)
                times.append((time.perf_counter() - t0) / iters)
            row[name] = times
        rows.append(row)
    ex.native = native.enabled(comm.world_size)
    return rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("-n", type=int, default=2)
    ap.add_argument("--sizes", nargs="+", default=["8", "4K", "256K", "2M", "16M"])
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--json")
    args = ap.parse_args(argv)
    if not native.enabled(args.n):
        print("the native runner is not built or TILECOMM_NATIVE=0", file=sys.stderr)
        return 1
    sizes = [parse_size(s) for s in args.sizes]
    per_rank = tilecomm.launch(_work, args.n, sizes, args.rounds)
    out = []
    print(f"{'size':>6} {'native us':>10} {'python us':>10} {'python/native':>14}")
    for i, nbytes in enumerate(sizes):
        med = {}
        for eng in ("native", "python"):
            rounds = [max(r[i][eng][k] for r in per_rank) for k in range(args.rounds)]
            med[eng] = statistics.median(rounds) * 1e6
        out.append({"bytes": nbytes, "world_size": args.n, "native_us": med["native"],
                    "python_us": med["python"]})
        print(f"{format_size(nbytes):>6} {med['native']:>10.1f} {med['python']:>10.1f} "
              f"{med['python'] / med['native']:>13.2f}x")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())

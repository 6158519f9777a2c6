"""Fused vs unfused all_gather_matmul / matmul_reduce_scatter on local CPU ranks.

    PYTHONPATH=src python benchmarks/overlap_cpu.py [--ranks 2] [--m 256] [--k 1024]
        [--n 1024] [--dtype float32] [--reps 15] [--json out.json]

Each rank runs one thread (tilecomm.launch). Per repetition, in alternating order, with a
barrier before each timed call: unfused ``comm.all_gather(a)`` then ``torch.matmul``; fused
``all_gather_matmul``; unfused ``torch.matmul`` then ``comm.reduce_scatter``; fused
``matmul_reduce_scatter``. Prints, per op, the median time of the slowest rank per call with
its quartiles, the ratio of the medians unfused / fused (> 1: the fused op is faster), and the
median and quartiles of the per-repetition ratio (the fused and the unfused call of one
repetition run next to each other, so this ratio is less exposed to load that drifts during
the run than the ratio of medians).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch

import tilecomm
from tilecomm.ops import all_gather_matmul, matmul_reduce_scatter


def _bench(comm, m, k, n, dtype, reps):
    w = comm.world_size
    g = torch.Generator().manual_seed(comm.rank)
    a = torch.randn(m, k, generator=g).to(dtype)
    b = torch.randn(k, n, generator=g).to(dtype)
    a_rs = torch.randn(w * m, k, generator=g).to(dtype)
    cases = {
        "ag_unfused": lambda: torch.matmul(comm.all_gather(a), b),
        "ag_fused": lambda: all_gather_matmul(a, b, comm),
        "rs_unfused": lambda: comm.reduce_scatter(torch.matmul(a_rs, b)),
        "rs_fused": lambda: matmul_reduce_scatter(a_rs, b, comm),
    }
    times = {name: [] for name in cases}
    for fn in cases.values():           # warm-up (workspaces, scratch)
        fn()
    for i in range(reps):
        order = list(cases) if i % 2 == 0 else list(reversed(cases))
        for name in order:
            comm.barrier()
            t0 = time.perf_counter()
            cases[name]()
            times[name].append(time.perf_counter() - t0)
    return times


def _quartiles(xs):
    q = statistics.quantiles(xs, n=4) if len(xs) > 1 else [xs[0]] * 3
    return q[0], q[2]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--m", type=int, default=256, help="rows per rank")
    ap.add_argument("--k", type=int, default=1024)
    ap.add_argument("--n", type=int, default=1024)
    ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    ap.add_argument("--reps", type=int, default=15)
    ap.add_argument("--json", default=None)
    a = ap.parse_args()
    dtype = getattr(torch, a.dtype)
    per_rank = tilecomm.launch(_bench, a.ranks, a.m, a.k, a.n, dtype, a.reps,
                               heap_bytes=256 << 20)
    # per repetition the slowest rank, then the median over repetitions
    slow = {name: [max(r[name][i] for r in per_rank) for i in range(a.reps)]
            for name in per_rank[0]}
    med = {name: statistics.median(v) for name, v in slow.items()}
    quart = {name: _quartiles(v) for name, v in slow.items()}
    print(f"{a.ranks} ranks, m={a.m} per rank, K={a.k}, N={a.n}, {a.dtype}, {a.reps} reps "
          f"(slowest rank per repetition; median [q1, q3])")
    paired = {}
    for op in ("ag", "rs"):
        u, f = med[f"{op}_unfused"], med[f"{op}_fused"]
        (uq1, uq3), (fq1, fq3) = quart[f"{op}_unfused"], quart[f"{op}_fused"]
        ratios = [x / y for x, y in zip(slow[f"{op}_unfused"], slow[f"{op}_fused"])]
        rq1, rq3 = _quartiles(ratios)
        paired[op] = dict(median=statistics.median(ratios), q1=rq1, q3=rq3)
        label = "all_gather_matmul" if op == "ag" else "matmul_reduce_scatter"
        print(f"{label:22} unfused {u * 1e3:7.2f} [{uq1 * 1e3:.2f}, {uq3 * 1e3:.2f}] ms  "
              f"fused {f * 1e3:7.2f} [{fq1 * 1e3:.2f}, {fq3 * 1e3:.2f}] ms  "
              f"unfused/fused {u / f:4.2f}  per-rep {paired[op]['median']:4.2f} "
              f"[{rq1:.2f}, {rq3:.2f}]")
    if a.json:
        with open(a.json, "w") as fh:
            json.dump({"args": vars(a), "median_s": med, "quartiles_s": quart,
                       "paired_ratio": paired}, fh, indent=1)


if __name__ == "__main__":
    main()

"""Open MPI baseline: float32 all_reduce with mpi4py, timed like ``tilecomm bench``.

Stays a script, outside the bench harness: it times no tilecomm call and runs under mpirun in
Debian's python3, which has neither torch nor tilecomm (``compare_mpi.py`` runs it).

Runs under Debian's python3 with Debian's mpi4py and numpy (``apt-get install openmpi-bin
python3-mpi4py python3-numpy``), so it needs nothing from this project:

    mpirun -n 2 --allow-run-as-root --oversubscribe python3 benchmarks/mpi_all_reduce.py \
        -b 8 -e 256M -f 4 --json /tmp/mpi.json

Per size: warmup, then ``rounds`` rounds of ``iters`` in-place MPI_Allreduce calls after a
barrier; a round's time is the slowest rank's mean; the median round is reported.
"""

import argparse
import json
import statistics
import time

import numpy as np
from mpi4py import MPI


def parse_size(s):
    s = s.upper().rstrip("B")
    mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(s[-1:], 1)
    return int(float(s[:-1] if s[-1:] in "KMG" else s) * mult)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("-b", default="8")
    ap.add_argument("-e", default="256M")
    ap.add_argument("-f", type=int, default=4)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    comm = MPI.COMM_WORLD
    rows, n = [], parse_size(args.b)
    while n <= parse_size(args.e):
        count = max(1, n // 4)
        buf = np.ones(count, np.float32)
        iters = max(3, min(500, (32 << 20) // max(n, 1)))
        for _ in range(max(1, iters // 5)):
            comm.Allreduce(MPI.IN_PLACE, buf, op=MPI.SUM)
        per_round = []
        for _ in range(args.rounds):
            comm.Barrier()
            t0 = time.perf_counter()
            for _ in range(iters):
                comm.Allreduce(MPI.IN_PLACE, buf, op=MPI.SUM)
            per_round.append(comm.allreduce((time.perf_counter() - t0) / iters, op=MPI.MAX))
        t = statistics.median(per_round)
        w = comm.Get_size()
        rows.append({"collective": "all_reduce", "impl": "openmpi", "world_size": w,
                     "bytes": count * 4, "time_us": t * 1e6,
                     "busbw_gbs": count * 4 / t / 1e9 * (2 * (w - 1) / w if w > 1 else 1)})
        n *= args.f
    if comm.Get_rank() == 0:
        for r in rows:
            print(f"{r['bytes']:>12} {r['time_us']:>12.1f} us {r['busbw_gbs']:>8.3f} GB/s")
        if args.json:
            with open(args.json, "w") as f:
                json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()

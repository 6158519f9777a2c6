"""Single-copy reads (peers read a rank's tensor in place with process_vm_readv) against
staging through shared memory, in the same processes.

    python benchmarks/single_copy.py -n 2 --ops broadcast all_gather all_to_all all_reduce \
        --sizes 16K 64K 256K 2M 16M 64M [--json out.json]

Per collective, size and mode (switched on the executor between rounds, so both see the same
machine state): warm-up, then ``--rounds`` rounds of back-to-back calls (float32, auto
algorithm, ordinary tensors) after a barrier; a round's time is the slowest rank's mean; the
median round is reported. "single copy" lets every call of the size read in place
(TILECOMM_CMA_MIN_BYTES set to 1 on the executor); "staged" turns it off. Both give the same
bits (tests/runtime/test_single_copy.py). all_reduce reads its reduction operands staged either
way (only buffers peers copy are read in place), so it shows what the mode costs where it does
nothing.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

import torch

import tilecomm
from tilecomm.heap.base import SegmentLayout
from tilecomm.units import format_size, parse_size

MODES = ("single copy", "staged")


def _call(comm, op: str, x: torch.Tensor, out: torch.Tensor | None):
    if op == "broadcast":
        return comm.broadcast(x, root=0)
    if op == "all_gather":
        return comm.all_gather(x, out=out)
    if op == "all_to_all":
        return comm.all_to_all(x, out=out)
    return comm.all_reduce(x)


def _work(comm, ops, sizes, rounds):
    ex = comm.host.backend.executor
    comm.barrier()      # every rank has published what its start-up probe found
    can = {int(ex.ch.slots[r][SegmentLayout.CMA])
           for r in range(comm.world_size)} == {1}
    saved = ex.cma, ex.cma_min_bytes
    rows = []
    try:
        for op in ops:
            for nbytes in sizes:
                w = comm.world_size
                n = max(w, nbytes // 4 // w * w)
                x = torch.ones(n // w if op == "all_gather" else n)
                out = torch.empty(n) if op in ("all_gather", "all_to_all") else None
                iters = max(10, min(2000, int(1e8 // max(nbytes, 1))))
                row = {}
                for mode in MODES:
                    ex.cma = can and mode == "single copy"
                    ex.cma_min_bytes = 1
                    # memoized calls keep the programs (and places) they were built with:
                    # forget them, or the first mode would time both
                    comm.forget_calls()
                    for _ in range(5):
                        _call(comm, op, x, out)
                    times = []
                    for _ in range(rounds):
                        comm.barrier()
                        t0 = time.perf_counter()
                        for _ in range(iters):
                            _call(comm, op, x, out)
                        times.append((time.perf_counter() - t0) / iters)
                    row[mode] = times
                rows.append(row)
    finally:
        ex.cma, ex.cma_min_bytes = saved
    return can, rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("-n", type=int, default=2)
    ap.add_argument("--ops", nargs="+", default=["broadcast", "all_gather", "all_to_all",
                                                  "all_reduce"])
    ap.add_argument("--sizes", nargs="+", default=["16K", "64K", "256K", "2M", "16M", "64M"])
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--json")
    args = ap.parse_args(argv)
    sizes = [parse_size(s) for s in args.sizes]
    per_rank = tilecomm.launch(_work, args.n, args.ops, sizes, args.rounds)
    if not all(can for can, _ in per_rank):
        print("process_vm_readv between the ranks is not allowed here (tilecomm doctor)",
              file=sys.stderr)
        return 1
    out = []
    print(f"{'op':>11} {'size':>6} {'single copy us':>15} {'staged us':>10} {'speedup':>8}")
    i = 0
    for op in args.ops:
        for nbytes in sizes:
            med = {}
            for mode in MODES:
                rounds = [max(r[1][i][mode][k] for r in per_rank) for k in range(args.rounds)]
                med[mode] = statistics.median(rounds) * 1e6
            i += 1
            out.append({"collective": op, "bytes": nbytes, "world_size": args.n,
                        "single_copy_us": med["single copy"], "staged_us": med["staged"]})
            print(f"{op:>11} {format_size(nbytes):>6} {med['single copy']:>15.1f} "
                  f"{med['staged']:>10.1f} {med['staged'] / med['single copy']:>7.2f}x")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())

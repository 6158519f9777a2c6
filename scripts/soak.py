"""Long soak runs: a seeded random mix of collectives checked against the references.

    PYTHONPATH=src python scripts/soak.py --calls 100000 --seed 1 --world 3

Every call is drawn from ``(seed, world, index)`` alone (see ``tilecomm.soak``), so a wrong or
failing call is reported with the index that reruns it: ``--start INDEX --calls 1``. The ranks
use a small scratch area (``--scratch``, default 64 KiB) so that larger calls run in several
pieces. Prints progress per chunk and a summary; exits 1 if any call was wrong or raised.
"""

from __future__ import annotations

import argparse
import sys
import time

import tilecomm
from tilecomm.soak import soak_rank
from tilecomm.units import parse_size


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--calls", type=int, default=10_000, help="calls to make (default 10000)")
    ap.add_argument("--seed", type=int, default=0, help="seed of the mix (default 0)")
    ap.add_argument("--world", type=int, default=3, help="ranks (default 3)")
    ap.add_argument("--start", type=int, default=0, help="index of the first call (default 0)")
    ap.add_argument("--chunk", type=int, default=5_000, help="calls per progress line")
    ap.add_argument("--scratch", type=parse_size, default=64 << 10,
                    help="TILECOMM_SCRATCH_BYTES of the ranks (default 64K)")
    ap.add_argument("--heap", type=parse_size, default=64 << 20,
                    help="symmetric heap bytes per rank (default 64M)")
    ap.add_argument("--timeout", type=float, default=60.0, help="collective timeout (s)")
    a = ap.parse_args(argv)

    t0 = time.monotonic()
    done, wrong, by = 0, [], {}
    with tilecomm.RankGroup(a.world, timeout=a.timeout, heap_bytes=a.heap,
                            scratch_bytes=a.scratch) as group:
        start = a.start
        while done < a.calls:
            n = min(a.chunk, a.calls - done)
            try:
                results = group.run(soak_rank, a.seed, start, n)
            except tilecomm.RankError as e:
                print(f"FAILED after {done} calls ({time.monotonic() - t0:.1f} s):\n{e}",
                      file=sys.stderr)
                return 1
            for r in results:
                wrong += r["wrong"]
            for k, v in results[0]["by_collective"].items():
                by[k] = by.get(k, 0) + v
            done += n
            start += n
            print(f"{done} calls, {len(wrong)} wrong, {time.monotonic() - t0:.1f} s", flush=True)
    for line in wrong[:50]:
        print("WRONG", line)
    mix = ", ".join(f"{k} {v}" for k, v in sorted(by.items()))
    print(f"soak: world {a.world}, seed {a.seed}, calls {a.start}..{a.start + done - 1}: "
          f"{done} calls, {len(wrong)} wrong, {time.monotonic() - t0:.1f} s ({mix})")
    return 1 if wrong else 0


if __name__ == "__main__":
    sys.exit(main())

"""tilecomm vs Open MPI (mpi4py) vs Gloo: float32 all_reduce, measured back to back.

Stays a script around ``tilecomm bench``: Open MPI's ranks are other processes (mpirun, Debian's
python3 and mpi4py), so MPI cannot be a baseline inside the bench's ranks; tilecomm and Gloo
are timed by the bench itself (``tilecomm.bench.run``, Gloo interleaved round by round).

    python benchmarks/compare_mpi.py -n 2 -b 256K -e 256M -f 4 [--json out.json]

Runs ``tilecomm bench`` (auto algorithm, ordinary tensors, Gloo in the same processes) and then
``mpirun ... benchmarks/mpi_all_reduce.py`` on the same sizes, and prints busbw and the ratios:
``x gloo``, ``x mpi`` = that library's time / tilecomm's (above 1: tilecomm is faster). Needs
Debian's openmpi-bin and python3-mpi4py (see mpi_all_reduce.py).
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile

from tilecomm.bench import BenchConfig, run
from tilecomm.units import format_size, parse_size


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("-n", type=int, default=2)
    ap.add_argument("-b", default="256K")
    ap.add_argument("-e", default="256M")
    ap.add_argument("-f", type=int, default=4)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--algo", default="auto")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    sizes, s = [], parse_size(args.b)
    while s <= parse_size(args.e):
        sizes.append(s)
        s *= args.f
    rows = run(BenchConfig("all_reduce", args.n, sizes, algos=[args.algo], vs=["gloo"],
                           rounds=args.rounds, bound=False))
    here = os.path.dirname(os.path.abspath(__file__))
    with tempfile.NamedTemporaryFile(suffix=".json") as tmp:
        subprocess.run(["mpirun", "-n", str(args.n), "--allow-run-as-root", "--oversubscribe",
                        "/usr/bin/python3", os.path.join(here, "mpi_all_reduce.py"), "-b", args.b,
                        "-e", args.e, "-f", str(args.f), "--rounds", str(args.rounds),
                        "--json", tmp.name], check=True, stdout=subprocess.DEVNULL)
        mpi = {r["bytes"]: r for r in json.load(open(tmp.name))}
    print(f"{'size':>6} {'algo':>9} {'tilecomm us':>12} {'gloo us':>10} {'mpi us':>10} "
          f"{'busbw':>7} {'x gloo':>7} {'x mpi':>6}")
    out = []
    for r in rows:
        m = mpi.get(r["bytes"])
        r["mpi_time_us"] = m["time_us"] if m else None
        r["x_mpi"] = m["time_us"] / r["time_us"] if m else None
        out.append(r)
        print(f"{format_size(r['bytes']):>6} {r['algo']:>9} {r['time_us']:>12.1f} "
              f"{r['gloo_time_us']:>10.1f} {r['mpi_time_us'] or 0:>10.1f} {r['busbw_gbs']:>7.2f} "
              f"{r['x_gloo']:>7.1f} {r['x_mpi'] or 0:>6.2f}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())

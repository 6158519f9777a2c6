"""What the flight recorder costs per call: recording on vs off in the same run.

Stays a script (its timing is the bench harness's, ``tilecomm.bench.timing``): the recorder is
switched on a live communicator between rounds, which no ``tilecomm bench`` flag does, and the
last line times the recorder alone, in this process, with no ranks at all.

    python benchmarks/flight_overhead.py --ranks 1 2 --calls 500 --repeats 201

Each rank repeats a small in-place all_reduce (8 float32, the memoized fast path, where a
fixed per-call cost shows most) in rounds of ``--calls`` calls, the harness interleaving rounds
with ``comm.flight.enabled`` True and False (so drift and noise hit both alike); a round's
figure is the slowest rank's time per call, and the report gives each mode's median round,
their difference (the recorder's cost per call), their ratio and each mode's spread. A third
line times the recorder alone (issue + done of one record) in this process, without any
communication.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from statistics import median

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

import torch  # noqa: E402

import tilecomm  # noqa: E402
from tilecomm.bench.harness import method_stats  # noqa: E402
from tilecomm.debug.flight import FlightRecorder  # noqa: E402


def _rounds(comm, calls: int, repeats: int) -> dict:
    from tilecomm.bench.runner import safe_chunk
    from tilecomm.bench.timing import measure

    t = torch.ones(8)
    chunk = safe_chunk("all_reduce", torch.float32, comm.world_size)   # sums stay finite
    for _ in range(200):                        # warm the memo, caches and the recorder
        comm.all_reduce(t)

    def mode(enabled: bool):
        def switch():
            comm.flight.enabled = enabled
        return lambda tm: tm.calls("call", lambda: comm.all_reduce(t), calls,
                                   refill=lambda: t.fill_(1.0), chunk=chunk, setup=switch)
    out = measure(comm.barrier, {"on": mode(True), "off": mode(False)}, repeats)
    comm.flight.enabled = True
    return {"times": out}


def _alone(calls: int, repeats: int) -> list[float]:
    fl = FlightRecorder(0, 1, 2000)
    per = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        for _ in range(calls):
            fl.done(fl.issue("all_reduce", "one_shot", 32, "float32", 0))
        per.append((time.perf_counter() - t0) / calls)
    return per


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ranks", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--calls", type=int, default=500)
    ap.add_argument("--repeats", type=int, default=201)
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    rows = []
    for w in args.ranks:
        res = tilecomm.launch(_rounds, w, args.calls, args.repeats, timeout=60)
        # per mode the slowest rank of each round, the median round (tilecomm.bench.harness)
        on, off = (method_stats([r["times"][m] for r in res]) for m in ("on", "off"))
        rows.append({"what": f"all_reduce 8 x float32, {w} rank(s)",
                     "on_us": on.median_s * 1e6, "off_us": off.median_s * 1e6,
                     "cost_us": (on.median_s - off.median_s) * 1e6,
                     "ratio": on.median_s / off.median_s,
                     "on_spread": on.spread, "off_spread": off.spread})
    alone = median(_alone(args.calls * 10, args.repeats)) * 1e6
    rows.append({"what": "recorder alone (issue + done)", "on_us": alone, "off_us": 0.0,
                 "cost_us": alone, "ratio": None})
    print(f"{'case':40} {'on (us)':>9} {'off (us)':>9} {'cost (us)':>10} {'on/off':>7}")
    for r in rows:
        ratio = f"{r['ratio']:.3f}" if r["ratio"] else "-"
        print(f"{r['what']:40} {r['on_us']:9.2f} {r['off_us']:9.2f} {r['cost_us']:10.2f} "
              f"{ratio:>7}")
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()

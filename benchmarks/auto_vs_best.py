"""auto against the fastest candidate, and the cost model against the measurement, per size.

Runs ``tilecomm bench OP --algo all`` (auto beside every candidate, interleaved round by round)
for each collective on one host (2, 3, 4 ranks) or on simulated hosts (``--hosts 2 -n 4``, with
Gloo over all ranks as the baseline), writes the rows, and prints per (collective, ranks, size):
auto's time over the fastest candidate's, auto's over Gloo's, and auto's predicted time over
its measured time. Sizes the tune sweep measured are marked: the prediction there is a fit, so
only the other sizes score the model out of sample.

    python benchmarks/auto_vs_best.py --json benchmarks/results/auto_1host_dec06.json -n 2 3 4
    python benchmarks/auto_vs_best.py --json benchmarks/results/auto_2x2_dec06.json --hosts 2 -n 4
    python benchmarks/auto_vs_best.py --report benchmarks/results/auto_1host_dec06.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys

from tilecomm.bench import BenchConfig, runner
from tilecomm.tuning import sweep
from tilecomm.units import format_size

COLLECTIVES = ("all_reduce", "all_gather", "reduce_scatter", "broadcast", "all_to_all")
ONE_HOST_SIZES = [8 << (3 * k) for k in range(9)]        # 8 B .. 128 MiB by 8x
HOSTS_SIZES = [8 << (3 * k) for k in range(8)]           # 8 B .. 16 MiB by 8x
TRIES = 3                                                # launches per case at most


def measure(ranks: list[int], hosts: int) -> list[dict]:
    rows = []
    for n in ranks:
        for op in COLLECTIVES:
            per_host = [n // hosts] * hosts if hosts else None
            cfg = BenchConfig(op=op, world_size=n, hosts=per_host, algos=["all"], bound=False,
                              sizes=HOSTS_SIZES if hosts else ONE_HOST_SIZES, rounds=5,
                              vs=["gloo"] if hosts else [],
                              **({"iters": sweep.HOSTS_ITERS, "warmup": 2} if hosts else {}))
            for attempt in range(1, TRIES + 1):
                # NOTE [the slow launch] (bench/machine.py): a launch in the machine's slow
                # state times every call several times slower; it is run again
                got = runner.run(cfg)
                if not any(r.get("machine_slow") for r in got):
                    break
            for r in got:
                r["hosts"], r["launches"] = per_host, attempt
            rows += got
            print(f"{op} on {n} ranks: {len(got)} rows, {attempt} launch(es)", file=sys.stderr,
                  flush=True)
    return rows


def report(rows: list[dict]) -> str:
    slow = [r for r in rows if r.get("machine_slow")]
    rows = [r for r in rows if not r.get("machine_slow")]
    out = ["| collective | ranks | size | auto ran | auto / fastest | fastest | "
           "auto / Gloo | predicted / measured |", "|---|---:|---:|---|---:|---|---:|---:|"]
    within, pred_err, vs_gloo = [], [], []
    same, other = [], []    # auto over 1.10x: it ran the fastest algorithm itself / another
    keys = sorted({(r["collective"], r["world_size"], r["bytes"]) for r in rows})
    for coll, w, n in keys:
        group = [r for r in rows if (r["collective"], r["world_size"], r["bytes"]) == (coll, w, n)]
        auto = next((r for r in group if r.get("requested") == "auto"), None)
        cands = [r for r in group if r.get("requested") != "auto"]
        if auto is None or not cands:
            continue
        best = min(cands, key=lambda r: r["time_us"])
        ratio = auto["time_us"] / best["time_us"]
        within.append(ratio)
        if ratio > 1.10:
            (same if best["algo"] == auto["algo"] else other).append(ratio)
        gloo = auto.get("gloo_time_us")
        g = f"{auto['time_us'] / gloo:.2f}" if gloo else ""
        if gloo:
            vs_gloo.append(auto["time_us"] / gloo)
        swept = sweep.HOSTS_SIZES if auto.get("hosts") or "gloo_time_us" in auto \
            else sweep.HOST_SIZES
        pred = auto.get("auto_ranked", [[None, None]])[0][1]
        p = ""
        if pred:
            p = f"{pred / auto['time_us']:.2f}" + (" (fit)" if n in swept else "")
            if n not in swept:
                pred_err.append(abs(pred / auto["time_us"] - 1))
        out.append(f"| {coll} | {w} | {format_size(n)} | {auto['algo']} | {ratio:.2f} | "
                   f"{best['algo']} | {g} | {p} |")
    out.append("")
    if slow:
        out.append(f"left out: {len(slow)} rows of launches in the machine's slow state "
                   f"(NOTE [the slow launch])")
    out.append(f"auto within 10% of the fastest: {sum(x <= 1.10 for x in within)} of "
               f"{len(within)} sizes; median auto / fastest {statistics.median(within):.2f}, "
               f"worst {max(within):.2f}")
    out.append(f"of the {len(same) + len(other)} sizes over 1.10: {len(same)} where auto ran "
               f"the fastest algorithm itself (two rows of one algorithm differing: noise), "
               f"{len(other)} where another algorithm was faster")
    if vs_gloo:
        out.append(f"auto / Gloo: median {statistics.median(vs_gloo):.2f}, at most 1.0 at "
                   f"{sum(x <= 1.0 for x in vs_gloo)} of {len(vs_gloo)} sizes")
    if pred_err:
        out.append(f"cost model out of sample (sizes the tune sweep did not measure): median "
                   f"|predicted / measured - 1| {100 * statistics.median(pred_err):.0f}% over "
                   f"{len(pred_err)} sizes")
    return "\n".join(out)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-n", "--nranks", type=int, nargs="+", default=[2])
    ap.add_argument("--hosts", type=int, default=0)
    ap.add_argument("--json", help="write the rows here")
    ap.add_argument("--report", help="only print the table of an earlier --json file")
    a = ap.parse_args()
    if a.report:
        rows = json.load(open(a.report))
    else:
        rows = measure(a.nranks, a.hosts)
        if a.json:
            with open(a.json, "w") as f:
                json.dump(rows, f, indent=1)
    print(report(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Markdown tables for docs/benchmarks.md from the JSON rows in benchmarks/results/.

    python benchmarks/report.py > /tmp/tables.md
"""

import glob
import json
import os
import sys

from tilecomm.units import format_size

R = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results")


def x(r, name):
    """``x <name>``: that baseline's time / tilecomm's (rows before the one bench harness
    called it ``vs_<name>``, the same ratio)."""
    return r.get(f"x_{name}", r.get(f"vs_{name}"))


def load(name):
    path = os.path.join(R, name)
    return json.load(open(path)) if os.path.exists(path) else None


def algo_table(rows, title):
    algos = sorted({r["algo"] for r in rows})
    by = {}
    for r in rows:
        by.setdefault(r["bytes"], {})[r["algo"]] = r
    print(f"\n#### {title}\n")
    print("| size | " + " | ".join(f"{a} (us)" for a in algos) + " | best busbw (GB/s) |")
    print("|---:|" + "---:|" * len(algos) + "---:|")
    for size, d in by.items():
        best = min(d.values(), key=lambda r: r["time_us"])
        cells = []
        for a in algos:
            t = d[a]["time_us"] if a in d else None
            txt = "" if t is None else f"{t:.1f}"
            cells.append(f"**{txt}**" if a == best["algo"] else txt)
        print(f"| {format_size(size)} | " + " | ".join(cells) + f" | {best['busbw_gbs']:.2f} |")


def bound_table(rows, title):
    """Rows from 1 MB: the bound at the level each row is held to (cache or DRAM rates,
    ``tilecomm.bench.roofline``; rows written before the levels were all held to DRAM)."""
    print(f"\n#### {title}\n")
    print("| size | algo | time (us) | bound (us) | bound at | % of bound | memcpy (us) | "
          "copy GB/s | add GB/s |")
    print("|---:|---|---:|---:|---|---:|---:|---:|---:|")
    for r in rows:
        if r["bytes"] >= 1 << 20 and "bound_us" in r:
            print(f"| {format_size(r['bytes'])} | {r['algo']} | {r['time_us']:.0f} | "
                  f"{r['bound_us']:.0f} | {r.get('bound_level', 'dram')} | "
                  f"{100 * r['frac_of_bound']:.0f}% | "
                  f"{r.get('memcpy_time_us', r.get('memcpy_us')):.0f} | "
                  f"{r['copy_gbs']:.1f} | {r['add_gbs']:.1f} |")


def compare_table(rows, title):
    print(f"\n#### {title}\n")
    print("| size | algo (auto) | tilecomm (us) | Gloo (us) | Open MPI (us) | busbw (GB/s) | x Gloo | x MPI |")
    print("|---:|---|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        mpi = r.get("mpi_time_us")
        print(f"| {format_size(r['bytes'])} | {r['algo']} | {r['time_us']:.1f} | "
              f"{r['gloo_time_us']:.1f} | {mpi:.1f} | {r['busbw_gbs']:.2f} | {x(r, 'gloo'):.1f} | "
              f"{x(r, 'mpi'):.2f} |" if mpi else "")


def gloo_table(rows, title):
    print(f"\n#### {title}\n")
    print("| size | algo | tilecomm (us) | busbw (GB/s) | #wrong | Gloo (us) | Gloo busbw | x Gloo |")
    print("|---:|---|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        if "gloo_time_us" in r:
            g = f"{r['gloo_time_us']:.1f} | {r['gloo_busbw_gbs']:.3f} | {x(r, 'gloo'):.1f}"
        else:
            g = f"{r.get('gloo_error', 'n/a')} | | "
        print(f"| {format_size(r['bytes'])} | {r['algo']} | {r['time_us']:.1f} | "
              f"{r['busbw_gbs']:.3f} | {r.get('wrong', '')} | {g} |")


def main():
    lat = load("cpu_all_reduce_2ranks_8B.json")
    if lat:
        print("\n#### 8-byte all_reduce, 2 ranks (median of 9 rounds of 2000 calls)\n")
        print("| algo | time (us) |\n|---|---:|")
        for r in lat:
            print(f"| {r['algo']} | {r['time_us']:.1f} |")
    for w in (2, 4):
        for mem in ("user", "heap"):
            rows = load(f"cpu_all_reduce_{w}ranks_{mem}.json")
            if rows:
                algo_table(rows, f"all_reduce, {w} ranks, {mem} memory (float32)")
                bound_table(rows, f"Memory bound, {w} ranks, {mem} memory")
        rows = load(f"cpu_all_reduce_{w}ranks_vs_mpi_gloo.json")
        if rows:
            compare_table(rows, f"tilecomm vs Gloo vs Open MPI, all_reduce, {w} ranks")
    for path in sorted(glob.glob(os.path.join(R, "cpu_*_2ranks_gloo.json"))):
        rows = json.load(open(path))
        gloo_table(rows, f"{rows[0]['collective']}, 2 ranks, vs Gloo")
    return 0


if __name__ == "__main__":
    sys.exit(main())

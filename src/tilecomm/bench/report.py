"""Tables and JSON for benchmark rows (nccl-tests columns, plus baselines and the bound)."""

from __future__ import annotations

import json

from ..units import format_size

#: below this the bound (DRAM copy/add rates) is not shown: the data lives in cache
BOUND_MIN_BYTES = 1 << 20


def table(rows: list[dict], title: str = ""):
    """A rich Table of the rows."""
    from rich.table import Table

    t = Table(title=title or None, header_style="bold")
    cols = ["size", "count", "type", "algo", "time (us)", "algbw GB/s", "busbw GB/s"]
    has = lambda k: any(k in r for r in rows)  # noqa: E731
    if has("wrong"):
        cols.append("#wrong")
    if has("gloo_time_us") or has("gloo_error"):
        cols += ["gloo (us)", "gloo busbw", "x gloo"]
    if has("frac_of_bound"):
        cols += ["bound (us)", "% of bound", "x memcpy"]
    for c in cols:
        t.add_column(c, justify="left" if c in ("type", "algo") else "right")
    for r in rows:
        cells = [format_size(r["bytes"]), str(r["count"]), r["dtype"], r["algo"],
                 f"{r['time_us']:.1f}", f"{r['algbw_gbs']:.3f}", f"{r['busbw_gbs']:.3f}"]
        if "#wrong" in cols:
            cells.append(str(r.get("wrong", "")))
        if "gloo (us)" in cols:
            if "gloo_time_us" in r:
                cells += [f"{r['gloo_time_us']:.1f}", f"{r['gloo_busbw_gbs']:.3f}",
                          f"{r['vs_gloo']:.2f}"]
            else:
                cells += [r.get("gloo_error", "")[:24], "", ""]
        if "bound (us)" in cols:
            if "bound_us" in r and r["bytes"] >= BOUND_MIN_BYTES:
                cells += [f"{r['bound_us']:.1f}", f"{100 * r['frac_of_bound']:.0f}%",
                          f"{r['time_us'] / r['memcpy_us']:.2f}"]
            else:   # cache-resident sizes: a bound at DRAM rates says nothing there
                cells += ["-", "-", "-"]
        t.add_row(*cells)
    return t


def write_json(rows: list[dict], path: str) -> None:
    with open(path, "w") as f:
        json.dump(rows, f, indent=1)
        f.write("\n")

"""Tables and JSON of bench rows, one layout for every bench (collectives, moe, kv, ops).

A table reads, left to right: the bench's own columns that say what the case is (``lead``),
tilecomm's median time and the spread of its rounds, the bench's figures of that time
(``mid``: bandwidths, #wrong), each baseline's time and ``x <baseline>``, then the bench's
last columns (``tail``: the memory bound). Every ``x`` column is the baseline's time over
tilecomm's (above 1: tilecomm is faster), and the caption says so. A time measured with a
spread above the row's ``max_spread`` carries a ``*`` and the caption explains it.
"""

from __future__ import annotations

import json
from typing import Callable

from ..units import format_size
from .harness import PRIMARY

Column = tuple[str, Callable[[dict], str]]

#: the time units a bench's table uses (its JSON is always in microseconds)
SCALE = {"us": 1.0, "ms": 1e3, "s": 1e6}


def fmt(v, spec: str = ".2f") -> str:
    return "" if v is None else format(v, spec)


def baselines(rows: list[dict]) -> list[str]:
    """The baselines the rows compare with (``x_<name>`` keys), in the order first seen."""
    out: list[str] = []
    for r in rows:
        out += [k[2:] for k in r if k.startswith("x_") and k[2:] not in out]
    return out


def _mark(r: dict, *names: str) -> str:
    return "*" if any(n in r.get("noisy_methods", ()) for n in names) else ""


def caption(rows: list[dict], names: list[str], notes: list[str] = ()) -> str:
    """The legend: how ratios read, what a ``*`` means (when a row has one), ``notes``."""
    lines = list(notes)
    if names:
        lines.append("x B = B's time / tilecomm's time (above 1: tilecomm is faster; a floor "
                     "such as memcpy is at most 1)")
    if any(r.get("noisy") for r in rows):
        top = max(r.get("max_spread", 0) for r in rows)
        lines.append(f"* noisy: that time's rounds disagree by more than {top:g}x (spread = "
                     f"slowest round / fastest): rerun on a quieter machine before trusting it")
    return "\n".join(lines)


def table(rows: list[dict], title: str = "", *, lead: list[Column] = (),
          mid: list[Column] = (), tail: list[Column] = (), unit: str = "us",
          errors: dict[str, str] | None = None, notes: list[str] = ()):
    """A rich Table of the rows (module doc), its legend below it (not wrapped to the
    table's width). ``errors``: per baseline, the row key that says why it did not run (shown
    in its time column); ``notes``: lines for the legend (what the baselines are)."""
    from rich.console import Group
    from rich.table import Table
    from rich.text import Text

    k = SCALE[unit]
    notes = list(notes)             # the reasons baselines did not run join them
    names = baselines(rows)
    names += [b for b, key in (errors or {}).items()
              if b not in names and any(key in r for r in rows)]
    t = Table(title=title or None, header_style="bold")
    heads = [h for h, _ in lead] + [f"time ({unit})", "spread"] + [h for h, _ in mid]
    for b in names:
        heads += [f"{b} ({unit})", f"x {b}"]
    heads += [h for h, _ in tail]
    for h in heads:
        t.add_column(h, justify="left" if h in ("type", "algo", "case", "op") else "right")
    for r in rows:
        cells = [f(r) for _, f in lead]
        cells += [f"{num(r['time_us'] / k)}{_mark(r, PRIMARY)}",
                  fmt(r.get("spread"))]
        cells += [f(r) for _, f in mid]
        for b in names:
            bt = r.get(f"{b}_time_us")
            if bt is None:
                why = r.get((errors or {}).get(b, ""))
                cells += ["n/a" if why else "", ""]
                if why and f"{b} not run: {why}" not in notes:
                    notes.append(f"{b} not run: {why}")
                continue
            cells += [f"{num(bt / k)}{_mark(r, b)}",
                      f"{fmt(r.get(f'x_{b}'))}{_mark(r, PRIMARY, b)}"]
        cells += [f(r) for _, f in tail]
        t.add_row(*cells)
    legend = caption(rows, names, notes)
    return Group(t, Text(legend)) if legend else t


def num(v: float | None) -> str:
    """A time or rate with about three significant figures (no exponent above 0.001)."""
    if v is None:
        return ""
    if v >= 100:
        return f"{v:.0f}"
    return f"{v:.1f}" if v >= 10 else f"{v:.2f}" if v >= 1 else f"{v:.3g}"


def size_col(key: str = "bytes", head: str = "size") -> Column:
    return head, lambda r: format_size(r[key])


def write_json(rows: list[dict], path: str) -> None:
    with open(path, "w") as f:
        json.dump(rows, f, indent=1)
        f.write("\n")

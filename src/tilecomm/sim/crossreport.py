"""The out-of-sample report of the library model (``python -m tilecomm.sim.calibrate
--cross-validate``): leave-one-system-out per regime, per network class and per system; fit
small, predict large; in-sample last. Every figure is computed here from ``sim/data``."""

from __future__ import annotations

import numpy as np

from . import crossval, published, scalefit
from .published import REGIMES

HEAD = ("<= 64 KB", "64 KB - 256 MB", ">= 256 MB")


def _fmt(cell) -> str:
    return f"{cell[1]:.1%} ({cell[0]})" if cell else "-"


def _table(title: str, t: dict, first: str) -> list[str]:
    lines = [f"| {first} | " + " | ".join(HEAD) + " |", "|---|---:|---:|---:|"]
    lines += [f"| {k} | " + " | ".join(_fmt(t[k].get(r)) for r in REGIMES) + " |" for k in t]
    return [title, ""] + lines + [""]


def network_of(c: crossval.Check) -> str:
    """A check's group in the per-network table: the transport class, or one node."""
    return "one node" if c.row.nodes == 1 else c.row.transport_class


def headline(checks: list[crossval.Check]) -> str:
    t = crossval.table(checks)["ALL"]
    return (f"**{t['latency'][1]:.1%} at <= 64 KB, {t['middle'][1]:.1%} from 64 KB to 256 MB, "
            f"{t['bandwidth'][1]:.1%} at >= 256 MB**")


def per_system(checks: list[crossval.Check]) -> list[float | None]:
    """Per regime, the median over systems of each system's median |error|."""
    return [crossval.sys_median([(c.row.system, abs(c.error)) for c in checks
                                 if c.row.regime == reg]) for reg in REGIMES]


def scale_summary(sc: list[scalefit.ScaleCheck]) -> dict:
    """{regime: (points, median |own-fit error|, median |class-only error|)}."""
    out = {}
    for reg in REGIMES:
        cs = [s for s in sc if s.check.row.regime == reg]
        if cs:
            out[reg] = (len(cs), float(np.median([abs(s.check.error) for s in cs])),
                        float(np.median([abs(s.class_error) for s in cs])))
    return out


def report(paths=None, write: str | None = None) -> str:
    rows = published.load(paths)
    systems = sorted({r.system for r in rows})
    loso, _ = crossval.cross_validate(rows)
    sc = scalefit.scale_checks(rows)
    lines = [f"Leave one system out: {len(systems)} systems, {len(rows)} rows "
             f"({len({r.source for r in rows})} sources), median |predicted/measured - 1|", "",
             "All: " + headline(loso),
             "Every system weighed the same (median over systems of each system's median): "
             + ", ".join(f"{h} {v:.1%}" for h, v in zip(HEAD, per_system(loso)) if v is not None),
             ""]
    lines += _table("By network (the held-out system's transport class):",
                    crossval.table(loso, network_of), "network")
    lines += _table("By collective:", crossval.table(loso, lambda c: c.row.collective),
                    "collective")
    unseen = [c for c in loso if not c.net_fitted]
    if unseen:
        lines += _table("Rows whose network class no training system had (class defaults):",
                        crossval.table(unseen, lambda c: c.row.transport_class), "class")
    ss = scale_summary(sc)
    lines += ["Fit small, predict large (own fit on the smallest multi-node count, scored on "
              "larger counts only; class-only = the LOSO prediction of the same rows):", "",
              "| regime | points | own fit | class only |", "|---|---:|---:|---:|"]
    lines += [f"| {h} | {ss[r][0]} | {ss[r][1]:.1%} | {ss[r][2]:.1%} |"
              for r, h in zip(REGIMES, HEAD) if r in ss]
    lines += ["", "| system | fitted on nodes | predicted nodes | " + " | ".join(HEAD) + " |",
              "|---|---:|---|---:|---:|---:|"]
    for s in sorted({x.check.row.system for x in sc}):
        mine = [x for x in sc if x.check.row.system == s]
        t = crossval.table([x.check for x in mine])["ALL"]
        nodes = ",".join(str(n) for n in sorted({x.check.row.nodes for x in mine}))
        lines.append(f"| {s} | {mine[0].fit_nodes} | {nodes} | "
                     + " | ".join(_fmt(t.get(r)) for r in REGIMES) + " |")
    lines.append("")
    lines += _table("By system (LOSO):", crossval.table(loso), "system")
    prm_all = crossval.fit(rows)
    lines += _table("In sample (fitted on every system; not a measure of accuracy):",
                    {"ALL": crossval.table(crossval.evaluate(rows, prm_all))["ALL"]}, "")
    d = prm_all.as_dict()
    net = d.pop("net")
    lines.append("Fitted on all systems: " + ", ".join(f"{k}={v:.3f}" for k, v in d.items())
                 + "; " + ", ".join(f"{k}: eff {v['eff']:.3f} lat {v['lat_us']:.1f} us"
                                    + ("" if prm_all.net_fitted(k) else " (default)")
                                    for k, v in net.items()))
    b = crossval.bands(loso)
    lines.append("Bands (LOSO signed error, 16th..84th percentile): " + ", ".join(
        f"{k} {v['q16']:+.0%}..{v['q84']:+.0%}" for k, v in b.items() if k in REGIMES))
    lines += ["", "| system | GPUs | nodes | collective | size | measured us | LOSO predicted us | "
              "error | algo/proto | bound |", "|---|---:|---:|---|---:|---:|---:|---:|---|---|"]
    for c in loso:
        r = c.row
        lines.append(f"| {r.system} | {r.gpus} | {r.nodes} | {r.collective} | {r.nbytes} | "
                     f"{r.time_us:.1f} | {c.predicted_us:.1f} | {c.error:+.1%} | "
                     f"{c.algo}/{c.protocol} | {c.bound} |")
    if write:
        crossval.write_fit(rows, loso, write, {"scale_bands": {
            reg: v for reg, v in crossval.bands([x.check for x in sc]).items()
            if reg in REGIMES}})
    return "\n".join(lines)

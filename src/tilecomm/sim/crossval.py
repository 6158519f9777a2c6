"""Leave-one-system-out (LOSO) validation of the ``--library nccl`` model on published data.

Every published system is described by **classes only** (:data:`SYSTEMS`: a generic preset -
GPU generation, NVLink generation, NVSwitch with or without NVLS, NIC rate - plus the GPU and
NIC counts of the measured machine; nothing fitted to that machine). The model's free class
parameters (:class:`~tilecomm.sim.ncclsim.NcclParams`: ``host_us``, ``ring_eff``, ``nvls_eff``,
``net_eff``, ``fill_MB``) are fitted by :func:`fit` on a set of rows; :func:`cross_validate` fits them on all
systems but one, predicts the held-out one, and repeats for every system.

Fit (robust, per-system weighted): ``host_us`` = median over systems of the median latency-regime
residual (measured - predicted without host), >= 0; ``fill_MB`` likewise from middle-regime
rows of >= FILL_BYTES (residual x the row's bandwidth); each efficiency is rescaled by the median
over systems of (predicted / measured transfer time) of its bandwidth-regime rows bound by it
(``ring_eff``/``nvls_eff`` from single-domain rows only; three passes). A parameter no training row informs keeps its sourced default.

Bands: the 16th and 84th percentiles of the signed LOSO errors of a regime give a prediction's
``low``/``high`` (:func:`bands`); ``--write-bands`` stores them with the all-systems fit in
``sim/data/nccl_fit.json``, which ``tilecomm sim`` reads.
"""

from __future__ import annotations

import csv
import json
import os
from dataclasses import dataclass

import numpy as np

from tilecomm.algorithms import BUSBW_FACTOR
from tilecomm.topology import Topology, build, get_preset

from .ncclsim import DEFAULT, FILL_BYTES, NcclParams, nccl_choice

LAT_MAX, BW_MIN = 64 << 10, 256 << 20
REGIMES = ("latency", "middle", "bandwidth")
DATA_DIR = os.path.join(os.path.dirname(__file__), "data")
EXTRA_CSV = os.path.join(DATA_DIR, "published-extra.csv")
FIT_JSON = os.path.join(DATA_DIR, "nccl_fit.json")
SHARED_CSV = os.path.normpath(os.path.join(os.path.dirname(__file__), "..", "..", "..", "..",
                                           "shared", "data", "published-calibration.csv"))


def regime(nbytes: int) -> str:
    return "latency" if nbytes <= LAT_MAX else ("bandwidth" if nbytes >= BW_MIN else "middle")


def _spec(preset: str, **changes):
    s = get_preset(preset)
    return s.with_(**changes) if changes else s


# system-name prefix -> (machine id, spec builder, algorithms the measurement allowed or None
# for NCCL's own choice). Specs are generic presets (datasheet classes) with the measured
# machine's counts; nothing here is fitted.
SYSTEMS = {
    "Azure ND H100 v5": ("azure-nd-h100-v5", lambda: _spec("dgx-h100"), ("nvls",)),
    "Azure ND A100 v4": ("azure-nd-a100-v4", lambda: _spec("dgx-a100"), ("ring", "tree")),
    "Azure ND H200 v5": ("azure-nd-h200-v5", lambda: _spec("hgx-h200"), ("nvls",)),
    "Azure ND GB200 v6": ("azure-nd-gb200-v6", lambda: _spec("gb200-nvl72"), ("ring",)),
    # 8x 200 Gb/s per node (GCP A3 Mega); achievable fraction as CX7's 48.5 of 50 GB/s
    "GCP A3 Mega": ("gcp-a3-mega", lambda: _spec("dgx-h100", nic_GBps=24.25), None),
    "CoreWeave GB200 NVL72": ("coreweave-nvl72", lambda: _spec("gb200-nvl72"), None),
    "CoreWeave 20 racks GB200 NVL72": ("coreweave-nvl72-x20", lambda: _spec("gb200-nvl72"), None),
    "CoreWeave 2 nodes x 8 B200": ("coreweave-b200-2node", lambda: _spec("dgx-b200"), None),
    "CoreWeave 2 nodes x 8 H100": ("coreweave-h100-2node", lambda: _spec("dgx-h100"), None),
    "8x H20 HGX": ("h20-deepep303", lambda: _spec("dgx-h100", gpu="H20"), None),
    "2 nodes x 8 H20 HGX": ("h20-2node-nccl1244", lambda: _spec("dgx-h100", gpu="H20"),
                            ("nvls_tree",)),
    "8x H100 SXM (subset), NVLS": ("h100-nccl1455", lambda: _spec("dgx-h100"), ("nvls",)),
    "8x H100 SXM, Ring": ("h100-nccl1455", lambda: _spec("dgx-h100"), ("ring",)),
    "Voltage Park 8x H100 SXM": ("voltage-park-h100", lambda: _spec("dgx-h100"), None),
    "8x A100 SXM node": ("a100-nccltests175", lambda: _spec("dgx-a100"), None),
    "2 nodes x 8 A100, 4x 200G": ("a100-2node-nccltests175",
                                  lambda: _spec("dgx-a100", nics_per_node=4), None),
}


@dataclass
class Row:
    system: str          # machine id (the LOSO unit)
    label: str
    collective: str
    gpus: int
    nodes: int
    nbytes: int
    time_us: float       # measured
    algos: tuple | None
    source: str
    spec_key: str

    @property
    def regime(self) -> str:
        return regime(self.nbytes)

    def topo(self) -> Topology:
        spec = SYSTEMS[self.spec_key][1]()
        return build(spec, self.nodes, self.gpus // self.nodes)


def load(paths) -> list[Row]:
    """Rows of the CSVs the model can check: a mapped system, numeric size, busbw or time."""
    out = []
    for path in paths:
        with open(path) as f:
            for r in csv.DictReader(f):
                key = next((k for k in SYSTEMS if r["system"].startswith(k)), None)
                if key is None or not r["bytes"].isdigit():
                    continue
                coll = r["collective"]
                if coll not in BUSBW_FACTOR or coll == "send_recv":
                    continue
                g, n, v = int(r["gpus"]), int(r["bytes"]), float(r["value"])
                if r["metric"].startswith("busbw"):
                    t = n / (v / BUSBW_FACTOR[coll](g) * 1e3)
                elif r["metric"] == "time" and r["unit"] == "us":
                    t = v
                else:
                    continue
                mid, _, algos = SYSTEMS[key]
                out.append(Row(mid, key, coll, g, int(r["nodes"]), n, t, algos, r["source"], key))
    return out


def predict_row(row: Row, prm: NcclParams):
    return nccl_choice(row.collective, row.nbytes, row.topo(), prm, row.algos)


def _sys_median(pairs) -> float | None:
    """Median over systems of each system's median value; ``pairs`` = [(system, value)]."""
    by: dict[str, list[float]] = {}
    for s, v in pairs:
        by.setdefault(s, []).append(v)
    if not by:
        return None
    return float(np.median([np.median(v) for v in by.values()]))


EFF_OF_BOUND = {"nvlink": "ring_eff", "nvls": "nvls_eff", "net": "net_eff", "mesh": "mesh_eff"}


def fit(rows: list[Row], passes: int = 3) -> NcclParams:
    """Class parameters fitted on ``rows`` (see module docstring)."""
    prm = DEFAULT
    topos = {}
    for _ in range(passes):
        preds = []
        for r in rows:
            key = (r.spec_key, r.nodes, r.gpus)
            topo = topos.get(key) or topos.setdefault(key, r.topo())
            preds.append(nccl_choice(r.collective, r.nbytes, topo, prm, r.algos))
        h = _sys_median([(r.system, r.time_us - (p.time_us - prm.host_us))
                         for r, p in zip(rows, preds) if r.regime == "latency"])
        changes = {}
        if h is not None:
            changes["host_us"] = max(0.0, h)
        # fill: middle-regime residual (as bytes at the row's bandwidth) where it is whole
        fill_us = [prm.fill_MB * 1e3 / p.bw_GBps for p in preds]
        fl = _sys_median([(r.system, (r.time_us - (p.time_us - f)) * p.bw_GBps / 1e3)
                          for r, p, f in zip(rows, preds, fill_us)
                          if r.regime == "middle" and r.nbytes >= FILL_BYTES])
        if fl is not None:
            changes["fill_MB"] = max(0.0, fl)
        for bound, name in EFF_OF_BOUND.items():
            ratios = []
            for r, p in zip(rows, preds):
                if r.regime != "bandwidth":
                    continue
                if p.bound != bound:
                    continue
                if bound != "net" and r.nodes > 1:
                    continue   # NVLink/NVLS efficiencies: from one NVLink domain only, where
                    # nothing else (tree depth, NICs, channels across nodes) can be mixed in
                moved = p.time_us - prm.host_us - p.lat_us
                meas = r.time_us - prm.host_us - p.lat_us
                if moved > 0 and meas > 0:
                    ratios.append((r.system, moved / meas))
            m = _sys_median(ratios)
            if m is not None:
                changes[name] = min(1.0, getattr(prm, name) * m)
        srcs = dict(prm.sources)
        for k in changes:
            srcs[k] = f"fitted on {len({r.system for r in rows})} published systems (crossval.fit)"
        prm = prm.with_(**changes, sources=srcs)
    return prm


@dataclass
class Check:
    row: Row
    predicted_us: float
    algo: str
    protocol: str
    bound: str

    @property
    def error(self) -> float:
        return (self.predicted_us - self.row.time_us) / self.row.time_us


def evaluate(rows: list[Row], prm: NcclParams) -> list[Check]:
    out = []
    for r in rows:
        p = predict_row(r, prm)
        out.append(Check(r, p.time_us, p.algo, p.protocol, p.bound))
    return out


def cross_validate(rows: list[Row], fit_fn=fit) -> tuple[list[Check], dict[str, NcclParams]]:
    """LOSO: for every system, fit on the others (``fit_fn``) and predict it."""
    checks, params = [], {}
    for s in sorted({r.system for r in rows}):
        train = [r for r in rows if r.system != s]
        prm = fit_fn(train)
        params[s] = prm
        checks += evaluate([r for r in rows if r.system == s], prm)
    return checks, params


def table(checks: list[Check]) -> dict:
    """{system or 'ALL': {regime: (points, median |error|)}}."""
    out: dict = {}
    for key in sorted({c.row.system for c in checks}) + ["ALL"]:
        cs = [c for c in checks if key == "ALL" or c.row.system == key]
        out[key] = {}
        for reg in REGIMES:
            e = [abs(c.error) for c in cs if c.row.regime == reg]
            if e:
                out[key][reg] = (len(e), float(np.median(e)))
    return out


def bands(checks: list[Check]) -> dict:
    """regime -> {"q16", "q84"} of signed LOSO errors, plus the median |error|."""
    out = {}
    for reg in REGIMES:
        e = np.array([c.error for c in checks if c.row.regime == reg])
        if len(e):
            out[reg] = {"q16": float(np.percentile(e, 16)), "q84": float(np.percentile(e, 84)),
                        "median_abs": float(np.median(np.abs(e))), "points": int(len(e))}
    return out


def band_of(time_us: float, nbytes: int, bands_: dict) -> tuple[float, float]:
    """(low, high) of the measured time given a prediction: meas = pred / (1 + error)."""
    b = bands_.get(regime(nbytes))
    if not b:
        return time_us, time_us
    return time_us / (1 + max(b["q84"], 0.0)), time_us / (1 + min(b["q16"], 0.0) + 1e-9)


def load_fit(path: str = FIT_JSON) -> tuple[NcclParams, dict]:
    """Class parameters fitted on every published system, and the LOSO bands."""
    try:
        with open(path) as f:
            d = json.load(f)
    except FileNotFoundError:
        return DEFAULT, {}
    prm = DEFAULT.with_(**d["params"], sources={**DEFAULT.sources, **d.get("sources", {})})
    return prm, d["bands"]


def _fmt(cell) -> str:
    return f"{cell[1]:.1%} ({cell[0]})" if cell else "-"


def report(paths, write: str | None = None) -> str:
    rows = load(paths)
    loso, _ = cross_validate(rows)
    prm_all = fit(rows)
    insample = evaluate(rows, prm_all)
    t_out, t_in = table(loso), table(insample)
    lines = [f"Leave-one-system-out, {len({r.system for r in rows})} systems, {len(rows)} rows "
             f"({', '.join(paths)})", "",
             "| system | <= 64 KB LOSO | middle LOSO | >= 256 MB LOSO | <= 64 KB in-sample | "
             "middle in-sample | >= 256 MB in-sample |", "|---|---:|---:|---:|---:|---:|---:|"]
    for key in t_out:
        lines.append(f"| {key} | " + " | ".join(_fmt(t_out[key].get(r)) for r in REGIMES) +
                     " | " + " | ".join(_fmt(t_in[key].get(r)) for r in REGIMES) + " |")
    lines += ["", "cells: median |error| (points). Fitted on all systems: " +
              ", ".join(f"{k}={v:.3f}" for k, v in prm_all.as_dict().items())]
    b = bands(loso)
    lines.append("bands (LOSO signed error 16th..84th percentile): " + ", ".join(
        f"{k} {v['q16']:+.0%}..{v['q84']:+.0%}" for k, v in b.items()))
    lines += ["", "| system | size | measured us | LOSO predicted us | error | algo/proto | "
              "bound |", "|---|---:|---:|---:|---:|---|---|"]
    for c in loso:
        lines.append(f"| {c.row.label} ({c.row.gpus}) | {c.row.nbytes} | {c.row.time_us:.1f} | "
                     f"{c.predicted_us:.1f} | {c.error:+.1%} | {c.algo}/{c.protocol} | "
                     f"{c.bound} |")
    if write:
        with open(write, "w") as f:
            json.dump({"params": prm_all.as_dict(),
                       "sources": {k: v for k, v in prm_all.sources.items()},
                       "bands": b, "systems": sorted({r.system for r in rows}),
                       "command": "python -m tilecomm.sim.calibrate --cross-validate "
                                  + " ".join(os.path.basename(p) for p in paths)
                                  + " --write-bands"}, f, indent=1)
    return "\n".join(lines)


def default_paths() -> list[str]:
    return [p for p in (SHARED_CSV, EXTRA_CSV) if os.path.exists(p)]

"""Leave-one-system-out (LOSO) validation of the ``--library nccl``/``rccl`` model on published
data (``sim/published.py``: every system described from its spec sheet, nothing fitted to it).

The model's free class parameters (:class:`~tilecomm.sim.ncclsim.NcclParams`) are fitted by
:func:`fit` on a set of rows; :func:`cross_validate` fits them on all systems but one, predicts
the held-out one, and repeats for every system.

Fit (robust: every statistic is the median over systems of each system's median):

* ``host_us``: the latency-regime residual of **one-node** rows (measured - predicted without
  host), >= 0; no network is involved there;
* per network class (``ib``, ``roce``, ``efa``, ``tcpx``, ``tcpxo``,
  ``socket``; ``ncclsim.TRANSPORT_CLASS``):
  ``lat_us`` = the latency-regime residual of multi-node rows of that class per network hop of
  the chosen algorithm; ``eff`` rescaled by the predicted / measured transfer time of its
  bandwidth-regime rows bound by the network. A class no training system informs keeps its
  assumed default, and its predictions get the wider band of :func:`bands` ("unseen network");
* ``fill_MB`` from one-node middle-regime rows of >= FILL_BYTES, ``net_fill_MB`` from multi-node
  middle-regime rows of >= 1 MiB (residual x the row's bandwidth over the fill's shape);
* ``ring_eff``/``nvls_eff``/``mesh_eff`` from one-node bandwidth-regime rows bound by them.

Three passes. Bands: the 16th and 84th percentiles of the signed LOSO errors of a regime give a
prediction's ``low``/``high``; ``--write-bands`` stores them with the all-systems fit in
``sim/data/nccl_fit.json``, which ``tilecomm sim`` reads. :mod:`~tilecomm.sim.scalefit` fits
one system's own small run (fit small, predict large).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, replace

import numpy as np

from . import published
from .ncclsim import DEFAULT, FILL_BYTES, NET_CLASSES, NcclParams, NcclRow, nccl_choice, net_hops
from .published import REGIMES, Row, regime

DATA_DIR = published.DATA_DIR
FIT_JSON = os.path.join(DATA_DIR, "nccl_fit.json")
COMMAND = "python -m tilecomm.sim.calibrate --cross-validate"


def library_choice(library: str):
    """What ``library`` (``nccl`` or ``rccl``) runs for a call, and our time of it."""
    if library == "rccl":
        from .rcclsim import rccl_choice
        return rccl_choice
    if library != "nccl":
        raise ValueError(f"unknown library {library!r}: nccl or rccl")
    return nccl_choice


def predict_row(row: Row, prm: NcclParams, topo=None) -> NcclRow:
    return library_choice(row.library)(row.collective, row.nbytes, topo or row.topo(), prm,
                                       row.algos)


def sys_median(pairs) -> float | None:
    """Median over systems of each system's median value; ``pairs`` = [(system, value)]."""
    by: dict[str, list[float]] = {}
    for s, v in pairs:
        by.setdefault(s, []).append(v)
    if not by:
        return None
    return float(np.median([np.median(v) for v in by.values()]))


EFF_OF_BOUND = {"nvlink": "ring_eff", "nvls": "nvls_eff", "mesh": "mesh_eff"}


def _fitted(rows) -> str:
    return f"fitted on {len({r.system for r in rows})} published systems (crossval.fit)"


def fit(rows: list[Row], passes: int = 3, start: NcclParams = DEFAULT,
        own: bool = False) -> NcclParams:
    """Class parameters fitted on ``rows``, from ``start`` (see module docstring).

    ``own``: a system's own fit (``scalefit.fit_own``): the network's efficiency is also read
    from rows of FILL_BYTES and up, not only from the bandwidth regime (a user's log may stop at
    32 MiB). Either way only rows predicted network-bound inform it: a row slower than its
    intra-node bound is not blamed on the network (on AWS p5, blaming the 2-node NVLS-tree
    shortfall on EFA made every larger count 30-40% too slow)."""
    prm = start
    topos: dict = {}
    for _ in range(passes):
        preds = []
        for r in rows:
            key = (r.system, r.nodes, r.gpus)
            topo = topos.get(key) or topos.setdefault(key, r.topo())
            preds.append((r, predict_row(r, prm, topo), topo))
        changes, srcs = {}, dict(prm.sources)
        one = [(r.system, r.time_us - (p.time_us - prm.host_us)) for r, p, _ in preds
               if r.regime == "latency" and r.nodes == 1]
        h = sys_median(one)
        if h is not None:
            changes["host_us"] = max(0.0, h)
            srcs["host_us"] = _fitted([r for r, _, _ in preds if r.nodes == 1])
        for name, multi, small in (("fill_MB", False, FILL_BYTES), ("net_fill_MB", True, 1 << 20)):
            # residual as MB at the row's bandwidth over the fill's shape, plus the current value:
            # one node from FILL_BYTES up (where the shape is whole), across nodes from 1 MiB
            rs = [(r, p) for r, p, _ in preds if r.regime == "middle" and r.nbytes >= small
                  and (r.nodes > 1) == multi]
            fill = sys_median([(r.system, (r.time_us - p.time_us) * p.bw_GBps / 1e3
                                 / min(1.0, r.nbytes / FILL_BYTES) + getattr(prm, name))
                                for r, p in rs])
            if fill is not None:
                changes[name] = max(0.0, fill)
                srcs[name] = _fitted([r for r, _ in rs])
        for bound, name in EFF_OF_BOUND.items():
            m = sys_median(_eff_ratios(preds, prm, lambda r, p: p.bound == bound and r.nodes == 1))
            if m is not None:
                changes[name] = min(1.0, getattr(prm, name) * m)
                srcs[name] = _fitted(rows)
        net = dict(prm.net)
        for cls in NET_CLASSES:
            mine = [(r, p, t) for r, p, t in preds if r.nodes > 1 and r.transport_class == cls]
            if not mine:
                continue
            c = net[cls]
            lat = sys_median([(r.system, (r.time_us - p.time_us) / hops + c.lat_us)
                               for r, p, t in mine if r.regime == "latency"
                               and (hops := net_hops(t, r.collective, p.algo)) > 0])
            eff = sys_median(_net_ratios(mine, prm, own))
            if lat is None and eff is None:
                continue        # the class's rows inform neither: it keeps its values
            c = replace(c, lat_us=c.lat_us if lat is None else max(0.0, lat),
                        eff=c.eff if eff is None else min(1.0, c.eff * eff))
            net[cls] = c
            srcs[f"net.{cls}"] = _fitted([r for r, _, _ in mine])
        prm = prm.with_(**changes, net=net, sources=srcs)
    return prm


def _eff_ratios(preds, prm: NcclParams, keep) -> list[tuple[str, float]]:
    """(system, predicted / measured transfer time) of bandwidth-regime rows ``keep`` selects."""
    out = []
    for r, p, _ in preds:
        if r.regime != "bandwidth" or not keep(r, p):
            continue
        moved = p.time_us - prm.host_us - p.lat_us
        meas = r.time_us - prm.host_us - p.lat_us
        if moved > 0 and meas > 0:
            out.append((r.system, moved / meas))
    return out


def _net_ratios(preds, prm: NcclParams, own: bool) -> list[tuple[str, float]]:
    """(system, predicted / measured transfer time) of multi-node rows predicted
    network-bound: bandwidth-regime rows, and with ``own`` every row from FILL_BYTES up."""
    out = []
    for r, p, _ in preds:
        if p.bound != "net" or (r.regime != "bandwidth" and not (own and r.nbytes >= FILL_BYTES)):
            continue
        moved = r.nbytes / (1e3 * p.bw_GBps)
        meas = r.time_us - prm.host_us - p.lat_us
        if meas > 0:
            out.append((r.system, moved / meas))
    return out


@dataclass
class Check:
    row: Row
    predicted_us: float
    algo: str
    protocol: str
    bound: str
    net_fitted: bool = True     # False: the row crosses a network class no fit informed

    @property
    def error(self) -> float:
        return (self.predicted_us - self.row.time_us) / self.row.time_us


def evaluate(rows: list[Row], prm: NcclParams) -> list[Check]:
    out = []
    for r in rows:
        p = predict_row(r, prm)
        seen = r.nodes == 1 or prm.net_fitted(r.transport_class)
        out.append(Check(r, p.time_us, p.algo, p.protocol, p.bound, seen))
    return out


def cross_validate(rows: list[Row], fit_fn=fit) -> tuple[list[Check], dict[str, NcclParams]]:
    """LOSO: for every system (or group of systems, ``Row.unit``), fit on the others
    (``fit_fn``) and predict it. Returns the checks and the fit of each unit."""
    checks, params = [], {}
    for u in sorted({r.unit for r in rows}):
        prm = fit_fn([r for r in rows if r.unit != u])
        params[u] = prm
        checks += evaluate([r for r in rows if r.unit == u], prm)
    return checks, params


def table(checks: list[Check], key=lambda c: c.row.system) -> dict:
    """{key or 'ALL': {regime: (points, median |error|)}}; ``key`` groups the checks."""
    out: dict = {}
    for k in sorted({key(c) for c in checks}) + ["ALL"]:
        cs = [c for c in checks if k == "ALL" or key(c) == k]
        out[k] = {}
        for reg in REGIMES:
            e = [abs(c.error) for c in cs if c.row.regime == reg]
            if e:
                out[k][reg] = (len(e), float(np.median(e)))
    return out


# fewest rows of a regime that make an unseen-network band (fewer: the regime's own band)
UNSEEN_MIN_POINTS = 5


def bands(checks: list[Check]) -> dict:
    """regime -> {"q16", "q84", "median_abs", "points"} of signed LOSO errors; the same under
    "unseen_network" from the rows whose network class no training system informed (regimes
    with at least UNSEEN_MIN_POINTS of them)."""
    def of(cs, least=1):
        out = {}
        for reg in REGIMES:
            e = np.array([c.error for c in cs if c.row.regime == reg])
            if len(e) >= least:
                out[reg] = {"q16": float(np.percentile(e, 16)),
                            "q84": float(np.percentile(e, 84)),
                            "median_abs": float(np.median(np.abs(e))), "points": int(len(e))}
        return out
    out = of(checks)
    unseen = of([c for c in checks if not c.net_fitted], UNSEEN_MIN_POINTS)
    if unseen:
        out["unseen_network"] = unseen
    return out


def band_of(time_us: float, nbytes: int, bands_: dict,
            unseen_network: bool = False) -> tuple[float, float]:
    """(low, high) of the measured time given a prediction: meas = pred / (1 + error). With
    ``unseen_network`` the wider of the regime's band and the unseen-network band."""
    reg = regime(nbytes)
    b = bands_.get(reg)
    if not b:
        return time_us, time_us
    q16, q84 = b["q16"], b["q84"]
    u = bands_.get("unseen_network", {}).get(reg) if unseen_network else None
    if u:
        q16, q84 = min(q16, u["q16"]), max(q84, u["q84"])
    return time_us / (1 + max(q84, 0.0)), time_us / (1 + min(q16, 0.0) + 1e-9)


def load_fit(path: str = FIT_JSON) -> tuple[NcclParams, dict]:
    """Class parameters fitted on every published system, and the LOSO bands."""
    try:
        with open(path) as f:
            d = json.load(f)
    except FileNotFoundError:
        return DEFAULT, {}
    return NcclParams.from_dict(d["params"], d.get("sources")), d["bands"]


def load_scale_bands(path: str = FIT_JSON) -> dict:
    """The fit-small-predict-large bands stored beside the fit (``{}`` without a fit file)."""
    try:
        with open(path) as f:
            return json.load(f).get("scale_bands", {})
    except FileNotFoundError:
        return {}


def write_fit(rows: list[Row], checks: list[Check], path: str = FIT_JSON,
              extra: dict | None = None) -> NcclParams:
    prm = fit(rows)
    with open(path, "w") as f:
        json.dump({"params": prm.as_dict(), "sources": dict(prm.sources),
                   "bands": bands(checks), "systems": sorted({r.system for r in rows}),
                   "command": COMMAND + " --write-bands", **(extra or {})}, f, indent=1)
    return prm

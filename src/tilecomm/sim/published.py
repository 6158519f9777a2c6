"""Published measurements, as the model checks them: systems (``data/systems-*.json``) and rows
(``data/sweeps-*.csv``), in the format of ``data/README.md``.

A :class:`PublishedSystem` is one measured machine described from its spec sheet (a preset plus
overrides; nothing fitted to its measurements). The unit left out in leave-one-system-out is its
``group``: systems that are one machine type measured under several ids (AWS p4d in four
sweeps, A3 Mega in two) are left out together, so that none is predicted from its twin.
A :class:`Row` is one published size of one sweep, as a time in us (busbw rows are converted with
nccl-tests' bus factor). Rows whose system is unknown, whose size is not a number, or whose
collective the model does not time are skipped.
"""

from __future__ import annotations

import csv
import glob
import json
import os
from dataclasses import dataclass, field

from tilecomm.algorithms import BUSBW_FACTOR
from tilecomm.topology import SystemSpec, Topology, build, spec_from_dict

from .ncclsim import TRANSPORT_CLASS

DATA_DIR = os.path.join(os.path.dirname(__file__), "data")
LAT_MAX, BW_MIN = 64 << 10, 256 << 20
REGIMES = ("latency", "middle", "bandwidth")
TIMED = ("all_reduce", "all_gather", "reduce_scatter", "broadcast", "reduce", "all_to_all")


def regime(nbytes: int) -> str:
    return "latency" if nbytes <= LAT_MAX else ("bandwidth" if nbytes >= BW_MIN else "middle")


@dataclass(frozen=True)
class PublishedSystem:
    id: str
    spec: SystemSpec
    library: str = "nccl"
    vm: bool | None = None
    algos: tuple | None = None
    match: tuple = ()
    algos_by_match: dict = field(default_factory=dict, compare=False, hash=False)
    source: str = ""
    group: str = ""          # left out together with the systems of the same group ("" = alone)

    @property
    def transport(self) -> str:
        return self.spec.fabric.transport

    @property
    def transport_class(self) -> str:
        return TRANSPORT_CLASS[self.transport]


def _system(d: dict, where: str) -> PublishedSystem:
    for k in ("id", "base"):
        if k not in d:
            raise ValueError(f"{where}: a system needs {k!r}")
    desc = {"base": d["base"], "name": d["id"], **(d.get("spec") or {})}
    if d.get("nccl_version"):
        desc["nccl_version"] = d["nccl_version"]
    try:
        spec = spec_from_dict(desc)
    except ValueError as e:
        raise ValueError(f"{where} ({d['id']}): {e}") from None
    lib = d.get("library") or "nccl"
    if lib not in ("nccl", "rccl"):
        raise ValueError(f"{where} ({d['id']}): library must be nccl or rccl, got {lib!r}")
    algos = tuple(d["algos"]) if d.get("algos") else None
    by = {k: tuple(v) for k, v in (d.get("algos_by_match") or {}).items()}
    return PublishedSystem(d["id"], spec, lib, d.get("vm"), algos, tuple(d.get("match") or ()),
                           by, d.get("source", ""), d.get("group") or "")


def load_systems(paths=None) -> dict[str, PublishedSystem]:
    """Every system of the ``systems-*.json`` files (default: the package's), by id."""
    paths = paths if paths is not None else sorted(glob.glob(os.path.join(DATA_DIR,
                                                                          "systems-*.json")))
    out: dict[str, PublishedSystem] = {}
    for p in paths:
        with open(p) as f:
            entries = json.load(f)
        for i, d in enumerate(entries):
            s = _system(d, f"{os.path.basename(p)}[{i}]")
            if s.id in out:
                raise ValueError(f"{os.path.basename(p)}: system id {s.id!r} is defined twice")
            out[s.id] = s
    return out


@dataclass
class Row:
    system: str          # machine id (the LOSO unit)
    label: str           # the system as the source's row names it
    collective: str
    gpus: int
    nodes: int
    nbytes: int
    time_us: float       # measured
    algos: tuple | None  # what the measurement forced, None = the library's choice
    source: str
    spec: SystemSpec
    library: str = "nccl"
    transport: str = "ib"
    group: str = ""      # PublishedSystem.group

    @property
    def unit(self) -> str:
        """What leave-one-system-out leaves out with this row: its group, else its system."""
        return self.group or self.system

    @property
    def regime(self) -> str:
        return regime(self.nbytes)

    @property
    def transport_class(self) -> str:
        return TRANSPORT_CLASS[self.transport] if self.nodes > 1 else "none"

    def topo(self) -> Topology:
        return build(self.spec, self.nodes, self.gpus // self.nodes)


def _find(systems: dict[str, PublishedSystem], label: str) -> tuple[PublishedSystem, str] | None:
    if label in systems:
        return systems[label], label
    for s in systems.values():
        for m in s.match:
            if label.startswith(m):
                return s, m
    return None


def default_sweeps() -> list[str]:
    return sorted(glob.glob(os.path.join(DATA_DIR, "sweeps-*.csv")))


def load(paths=None, systems: dict[str, PublishedSystem] | None = None) -> list[Row]:
    """Rows of the sweep CSVs (default: every ``data/sweeps-*.csv``) the model can check."""
    systems = systems if systems is not None else load_systems()
    out = []
    for path in (paths if paths is not None else default_sweeps()):
        with open(path) as f:
            for r in csv.DictReader(f):
                hit = _find(systems, r["system"])
                if hit is None or not r["bytes"].strip().isdigit():
                    continue
                sys_, m = hit
                coll = r["collective"].strip()
                if coll not in TIMED:
                    continue
                g, n, v = int(r["gpus"]), int(r["bytes"]), float(r["value"])
                if n <= 0 or v <= 0:
                    continue
                metric = r["metric"].strip()
                factor = BUSBW_FACTOR.get(coll, lambda w: 1.0)(g)
                if metric.startswith("busbw") and r["unit"].strip() == "GB/s":
                    t = n / (v / factor * 1e3)
                elif metric == "algbw" and r["unit"].strip() == "GB/s":
                    t = n / (v * 1e3)
                elif metric == "time" and r["unit"].strip() == "us":
                    t = v
                else:
                    continue
                algos = sys_.algos_by_match.get(m, sys_.algos)
                out.append(Row(sys_.id, r["system"], coll, g, int(r["nodes"]), n, t, algos,
                               r["source"], sys_.spec, sys_.library, sys_.transport,
                               sys_.group))
    return out

"""System description files (JSON): a preset to start from plus overrides, or a full system.

Format (docs/system-description.md; example in examples/systems/)::

    {"name": "my-cluster", "base": "dgx-h100",
     "nics_per_node": 4, "nic_GBps": 48.5,
     "fabric": {"rail_optimized": false, "oversubscription": 2.0},
     "protocols": [{"name": "Simple", "eff": 0.8, "step_intra_us": 3.4, "step_net_us": 14}]}
"""

from __future__ import annotations

import json
from dataclasses import fields
from pathlib import Path

from .presets import PRESETS, get_preset
from .spec import Fabric, Protocol, ShmCost, SystemSpec

_SPEC_FIELDS = {f.name for f in fields(SystemSpec)}
_FABRIC_FIELDS = {f.name for f in fields(Fabric)}


def spec_from_dict(d: dict) -> SystemSpec:
    """Build a :class:`SystemSpec` from a parsed description (unknown keys are errors)."""
    d = dict(d)
    base = d.pop("base", None)
    d.pop("comment", None)
    unknown = set(d) - _SPEC_FIELDS
    if unknown:
        raise ValueError(f"unknown system description keys: {sorted(unknown)}")
    if "fabric" in d:
        fab = d["fabric"]
        bad = set(fab) - _FABRIC_FIELDS
        if bad:
            raise ValueError(f"unknown fabric keys: {sorted(bad)}")
    if "protocols" in d:
        d["protocols"] = tuple(Protocol(**p) for p in d["protocols"])
    if d.get("shm") is not None:
        d["shm"] = ShmCost(**d["shm"])
    if base is not None:
        spec = get_preset(base)
        if "fabric" in d:
            d["fabric"] = Fabric(**{**spec.fabric.__dict__, **d["fabric"]})
        return spec.with_(**d)
    if "fabric" in d:
        d["fabric"] = Fabric(**d["fabric"])
    return SystemSpec(**d)


def load_system(name_or_path: str) -> SystemSpec:
    """A preset name, or a path to a ``.json`` system description."""
    if name_or_path in PRESETS:
        return get_preset(name_or_path)
    p = Path(name_or_path)
    if p.suffix == ".json" or p.exists():
        return spec_from_dict(json.loads(p.read_text()))
    return get_preset(name_or_path)  # raises with the list of presets

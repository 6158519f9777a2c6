"""System description files (JSON): a preset to start from plus overrides, or a full system.

Format (docs/system-description.md; example in examples/systems/)::

    {"name": "my-cluster", "base": "dgx-h100",
     "nics_per_node": 4, "nic_GBps": 48.5,
     "fabric": {"rail_optimized": false, "oversubscription": 2.0},
     "protocols": [{"name": "Simple", "eff": 0.8, "step_intra_us": 3.4, "step_net_us": 14}]}
"""

from __future__ import annotations

import json
from dataclasses import MISSING, fields
from pathlib import Path

from .presets import PRESETS, get_preset
from .spec import Fabric, Protocol, ShmCost, SystemSpec

_SPEC_FIELDS = {f.name for f in fields(SystemSpec)}
_FABRIC_FIELDS = {f.name for f in fields(Fabric)}


def _entry(cls, d, where: str):
    """``cls(**d)`` with errors naming ``where`` and the field (missing, unknown, bad type)."""
    if not isinstance(d, dict):
        raise ValueError(f"{where}: expected an object, got {d!r}")
    names = [f.name for f in fields(cls)]
    unknown = set(d) - set(names)
    if unknown:
        raise ValueError(f"{where}: unknown keys {sorted(unknown)}; valid: {', '.join(names)}")
    required = [f.name for f in fields(cls) if f.default is MISSING
                and f.default_factory is MISSING]
    for k in required:
        if k not in d:
            raise ValueError(f"{where}: missing {k}")
    try:
        return cls(**d)
    except ValueError as e:
        if str(e).startswith(where):   # already names the field (fabric.levels ...)
            raise
        raise ValueError(f"{where}: {e}") from None


def spec_from_dict(d: dict) -> SystemSpec:
    """Build a :class:`SystemSpec` from a parsed description (unknown keys are errors)."""
    if not isinstance(d, dict):
        raise ValueError(f"a system description is a JSON object, got {type(d).__name__}")
    d = dict(d)
    base = d.pop("base", None)
    d.pop("comment", None)
    unknown = set(d) - _SPEC_FIELDS
    if unknown:
        raise ValueError(f"unknown system description keys: {sorted(unknown)}")
    if "fabric" in d:
        fab = d["fabric"]
        if not isinstance(fab, dict):
            raise ValueError(f"fabric: expected an object, got {fab!r}")
        bad = set(fab) - _FABRIC_FIELDS
        if bad:
            raise ValueError(f"unknown fabric keys: {sorted(bad)}")
    if "protocols" in d:
        if not isinstance(d["protocols"], list):
            raise ValueError(f"protocols: expected a list, got {d['protocols']!r}")
        d["protocols"] = tuple(_entry(Protocol, p, f"protocols[{i}]")
                               for i, p in enumerate(d["protocols"]))
    if d.get("shm") is not None:
        d["shm"] = _entry(ShmCost, d["shm"], "shm")
    if base is not None:
        spec = get_preset(base)
        if "fabric" in d:
            d["fabric"] = _entry(Fabric, {**spec.fabric.__dict__, **d["fabric"]}, "fabric")
        return spec.with_(**d)
    if "fabric" in d:
        d["fabric"] = _entry(Fabric, d["fabric"], "fabric")
    missing = [f.name for f in fields(SystemSpec) if f.default is MISSING
               and f.default_factory is MISSING and f.name not in d]
    if missing:
        raise ValueError(f"missing {', '.join(missing)} (required unless the description "
                         "starts from a preset with 'base')")
    return SystemSpec(**d)


def load_system(name_or_path: str) -> SystemSpec:
    """A preset name, or a path to a ``.json`` system description."""
    if name_or_path in PRESETS:
        return get_preset(name_or_path)
    p = Path(name_or_path)
    if p.suffix == ".json" or p.exists():
        return spec_from_dict(json.loads(p.read_text()))
    return get_preset(name_or_path)  # raises with the list of presets

"""Where ``tilecomm tune`` keeps what it measured, and the cost model a process uses.

One JSON file per machine, ``<TILECOMM_TUNE_DIR>/tune-<fingerprint>.json``; the fingerprint
hashes what the costs depend on and a user cannot change by accident between runs (the CPU
model, the count of CPUs this process may use, the memory, the kernel's release and the
tilecomm cost-model version). Inside, the shared-memory fit per ranks-per-host count and the
inter-host curves per layout (``costs.curve_key``): one tune run adds or replaces its own
layout's entries and keeps the others.

:func:`current` is the model ``auto`` uses: the file of this machine when there is one (and
``TILECOMM_TUNE`` is not 0), else the shipped defaults. A file that does not parse is
reported once and ignored (a stale or hand-edited file must not stop a job).
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import sys
import time
import warnings
from dataclasses import asdict
from functools import lru_cache
from pathlib import Path

from ..settings import settings
from ..topology.presets import CPU_SHM_COST
from ..topology.spec import ShmCost
from .costs import CostModel
from .curves import Curve

#: bump when the meaning of a stored entry changes (old files are then ignored)
FORMAT = 1


def machine() -> dict:
    """What the fingerprint hashes (also stored in the file, for people to read)."""
    model = ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        model = platform.processor()
    try:
        cpus = len(os.sched_getaffinity(0))
    except AttributeError:
        cpus = os.cpu_count() or 1
    mem_gib = 0
    try:
        mem_gib = round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30)
    except (ValueError, OSError):
        pass
    return {"cpu": model, "cpus": cpus, "mem_gib": mem_gib, "kernel": platform.release(),
            "format": FORMAT}


def fingerprint(m: dict | None = None) -> str:
    return hashlib.sha1(json.dumps(m or machine(), sort_keys=True).encode()).hexdigest()[:12]


def path(directory: str | None = None) -> Path:
    d = Path(directory or settings().tune_dir).expanduser()
    return d / f"tune-{fingerprint()}.json"


def defaults() -> CostModel:
    """The shipped costs: the shared-memory fit of ``topology/presets.py`` and the measured
    2 x 2 simulated-host curves of ``tuning/shipped.py``."""
    from .shipped import CURVES, SOURCE
    return CostModel({0: CPU_SHM_COST}, {k: Curve.of(v) for k, v in CURVES.items()},
                     gpu_system=settings().gpu_system, source=SOURCE)


def read(p: Path) -> dict:
    data = json.loads(p.read_text())
    if data.get("format") != FORMAT:
        raise ValueError(f"format {data.get('format')!r}, this tilecomm reads {FORMAT}")
    return data


def model_of(data: dict, base: CostModel, source: str) -> CostModel:
    """``base`` with what the file measured put over it (shm fits per ranks, curves)."""
    shm = dict(base.shm)
    for k, v in data.get("shm", {}).items():
        shm[int(k)] = ShmCost(**v["params"])
    curves = dict(base.curves)
    for k, v in data.get("curves", {}).items():
        curves[k] = Curve.of(v)
    return CostModel(shm, curves, gpu_system=base.gpu_system, source=source)


@lru_cache(maxsize=1)
def current() -> CostModel:
    """The cost model of this process (see the module docstring)."""
    base = defaults()
    if not settings().tune:
        return base.with_source(base.source + "; TILECOMM_TUNE=0")
    p = path()
    if not p.exists():
        return base
    try:
        return model_of(read(p), base, f"tuned: {p}")
    except (ValueError, KeyError, TypeError, OSError) as e:
        warnings.warn(f"tilecomm: ignoring the tune file {p} ({e}); auto uses the shipped "
                      f"costs. Rerun `tilecomm tune` to replace it.", stacklevel=2)
        return base


def save(entries: dict, command: str, directory: str | None = None) -> Path:
    """Merge ``entries`` (``{"shm": {ranks: {"params": ShmCost fields, ...}}, "curves":
    {key: [[bytes, us], ...]}}``) into this machine's file; returns its path."""
    p = path(directory)
    p.parent.mkdir(parents=True, exist_ok=True)
    data = {"format": FORMAT, "machine": machine(), "shm": {}, "curves": {}, "runs": []}
    if p.exists():
        try:
            data = read(p)
        except (ValueError, OSError):
            pass            # replaced below
    for k, v in entries.get("shm", {}).items():
        data.setdefault("shm", {})[str(k)] = v
    data.setdefault("curves", {}).update(entries.get("curves", {}))
    data.setdefault("runs", []).append({"command": command, "when": time.strftime(
        "%Y-%m-%d %H:%M:%S"), "python": sys.version.split()[0]})
    tmp = p.with_suffix(".tmp")
    tmp.write_text(json.dumps(data, indent=1, sort_keys=True))
    os.replace(tmp, p)          # readers never see half a file
    current.cache_clear()
    return p


def shm_entry(p: ShmCost, **extra) -> dict:
    return {"params": asdict(p), **extra}

"""What this machine is: CPU, cores, NUMA nodes, memory, a quick memory bandwidth, GPUs."""

from __future__ import annotations

import os
import platform
import shutil
import subprocess
import time
from pathlib import Path

import numpy as np


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _numa_nodes() -> int:
    nodes = list(Path("/sys/devices/system/node").glob("node[0-9]*"))
    return len(nodes) or 1


def _mem_total_gb() -> float:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal"):
                return int(line.split()[1]) / 1e6
    except OSError:
        pass
    return 0.0


def _cpu_list_count(text: str) -> int:
    """Number of CPUs in a sysfs list such as ``0-3,8``."""
    n = 0
    for part in text.strip().split(","):
        if "-" in part:
            a, b = part.split("-")
            n += int(b) - int(a) + 1
        elif part:
            n += 1
    return n


def cpu_caches(root: str = "/sys/devices/system/cpu/cpu0/cache") -> dict[str, str]:
    """CPU 0's caches, e.g. ``{"L1d": "48K", "L2": "1024K per 1 CPU", "L3": "32768K per 2 CPUs"}``.

    From sysfs (``indexN/{level,type,size,shared_cpu_list}``), else ``lscpu``'s totals; empty
    when neither is available. The cpu-shm cost model's cache regime depends on these sizes.
    """
    out = {}
    for d in sorted(Path(root).glob("index[0-9]*")):
        try:
            level = (d / "level").read_text().strip()
            kind = (d / "type").read_text().strip()
            size = (d / "size").read_text().strip()
        except OSError:
            continue
        name = f"L{level}" + {"Data": "d", "Instruction": "i"}.get(kind, "")
        try:
            n = _cpu_list_count((d / "shared_cpu_list").read_text())
            size += f" per {n} CPU{'s' if n != 1 else ''}"
        except (OSError, ValueError):
            pass
        out[name] = size
    if out or not shutil.which("lscpu"):
        return out
    try:
        r = subprocess.run(["lscpu"], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return out
    for line in r.stdout.splitlines():
        key, _, val = line.partition(":")
        if key.strip().startswith("L") and key.strip().endswith("cache"):
            out[key.strip()[:-len(" cache")]] = val.strip() + " total"
    return out


def memory_bandwidth_GBps(nbytes: int = 64 << 20, repeats: int = 3) -> dict[str, float]:
    """Single-thread numpy copy and add rates (GB/s of bytes written), best of ``repeats``."""
    a = np.ones(nbytes // 8)
    b = np.empty_like(a)
    best_copy = best_add = float("inf")
    for _ in range(repeats):
        t = time.perf_counter()
        np.copyto(b, a)
        best_copy = min(best_copy, time.perf_counter() - t)
        t = time.perf_counter()
        np.add(b, a, out=b)
        best_add = min(best_add, time.perf_counter() - t)
    return {"copy_GBps": nbytes / best_copy / 1e9, "add_GBps": nbytes / best_add / 1e9}


def gpus() -> dict:
    """GPUs and their interconnect matrix from ``nvidia-smi`` (``gpus`` says so when absent)."""
    if not shutil.which("nvidia-smi"):
        return {"gpus": "none found (nvidia-smi not present)"}
    out = {}
    try:
        q = subprocess.run(["nvidia-smi", "--query-gpu=index,name,memory.total",
                            "--format=csv,noheader"], capture_output=True, text=True, timeout=20)
        found = [ln.strip() for ln in q.stdout.splitlines() if ln.strip()]
        out["gpus"] = found or "none found (nvidia-smi listed none)"
        t = subprocess.run(["nvidia-smi", "topo", "-m"], capture_output=True, text=True,
                           timeout=20)
        out["topo"] = t.stdout.strip()
    except (OSError, subprocess.TimeoutExpired) as e:
        out["error"] = str(e)
    return out


def detect(measure: bool = True) -> dict:
    info = {"cpu": _cpu_model(), "cores": os.cpu_count() or 1, "numa_nodes": _numa_nodes(),
            "memory_GB": round(_mem_total_gb(), 1)}
    info.update({f"cache {k}": v for k, v in cpu_caches().items()})
    if measure:
        info.update({k: round(v, 2) for k, v in memory_bandwidth_GBps().items()})
    info.update(gpus())
    return info

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
    """GPUs and their interconnect matrix from ``nvidia-smi`` (empty when absent)."""
    if not shutil.which("nvidia-smi"):
        return {}
    out = {}
    try:
        q = subprocess.run(["nvidia-smi", "--query-gpu=index,name,memory.total",
                            "--format=csv,noheader"], capture_output=True, text=True, timeout=20)
        out["gpus"] = [ln.strip() for ln in q.stdout.splitlines() if ln.strip()]
        t = subprocess.run(["nvidia-smi", "topo", "-m"], capture_output=True, text=True,
                           timeout=20)
        out["topo"] = t.stdout.strip()
    except (OSError, subprocess.TimeoutExpired) as e:
        out["error"] = str(e)
    return out


def detect(measure: bool = True) -> dict:
    info = {"cpu": _cpu_model(), "cores": os.cpu_count() or 1, "numa_nodes": _numa_nodes(),
            "memory_GB": round(_mem_total_gb(), 1)}
    if measure:
        info.update({k: round(v, 2) for k, v in memory_bandwidth_GBps().items()})
    info.update(gpus())
    return info

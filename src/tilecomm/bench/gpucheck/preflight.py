"""Phase ``preflight`` (parent side): what this machine is, and whether it can run the check.

Read, never changed: the CUDA driver version (``cuDriverGetVersion``, nvidia-smi) against the
ptxas Triton bundles, a tiny Triton kernel compiled and run (plain and cooperative), compute
mode (``Prohibited``, or ``Exclusive`` without MPS: cannot run), MIG (no CUDA IPC on MIG
instances: cannot run), MPS, peer access between visible GPUs, NVLink, the NCCL version, the
tools (``ncu``, ``nvidia-cuda-mps-control``). The GPU probe runs in a subprocess so that the
parent never initializes CUDA before its ranks fork; under an MPS daemon it runs as an MPS
client, so it also says what SM count a rank's share gives.

``environment()`` is the software and hardware the figures belong to.
"""

from __future__ import annotations

import json
import os
import platform
import re
import shutil
import subprocess
import sys
import tempfile

_PROBE = r"""
import json, os, sys, ctypes
res = {}
try:
    lib = ctypes.CDLL("libcuda.so.1")
    v = ctypes.c_int(0)
    if lib.cuInit(0) == 0 and lib.cuDriverGetVersion(ctypes.byref(v)) == 0:
        res["driver_cuda"] = f"{v.value // 1000}.{v.value % 1000 // 10}"
except OSError as e:
    res["driver_cuda_error"] = str(e)
import torch
res["torch_cuda"] = torch.version.cuda
try:
    v = torch.cuda.nccl.version()
    res["nccl"] = ".".join(map(str, v)) if isinstance(v, tuple) else str(v)
except Exception as e:
    res["nccl"] = None
res["cuda_available"] = torch.cuda.is_available()
res["mps_share"] = os.environ.get("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE")
if res["cuda_available"]:
    n = torch.cuda.device_count()
    res["device_count"] = n
    res["devices"] = []
    for i in range(n):
        p = torch.cuda.get_device_properties(i)
        res["devices"].append(dict(name=p.name, capability=f"{p.major}.{p.minor}",
                                   sm_count=p.multi_processor_count,
                                   memory_GiB=round(p.total_memory / 2**30, 1)))
    res["peer_access"] = [[i == j or torch.cuda.can_device_access_peer(i, j)
                           for j in range(n)] for i in range(n)]
    try:
        import triton, triton.language as tl
        @triton.jit
        def _k(x, n, B: tl.constexpr):
            o = tl.program_id(0) * B + tl.arange(0, B)
            tl.store(x + o, tl.load(x + o, mask=o < n) + 1, mask=o < n)
        x = torch.zeros(1000, device="cuda:0")
        _k[(4,)](x, 1000, B=256)
        torch.cuda.synchronize()
        res["triton_smoke"] = "ok" if bool((x == 1).all()) else "wrong result"
        try:
            _k[(4,)](x, 1000, B=256, launch_cooperative_grid=True)
            torch.cuda.synchronize()
            res["cooperative_smoke"] = "ok" if bool((x == 2).all()) else "wrong result"
        except Exception as e:
            res["cooperative_smoke"] = f"{type(e).__name__}: {str(e)[:300]}"
    except Exception as e:
        res["triton_smoke"] = f"{type(e).__name__}: {str(e)[:400]}"
    if n >= 2 and res["peer_access"][0][1]:
        a = torch.ones(64 << 18, device="cuda:0"); b = torch.empty(64 << 18, device="cuda:1")
        b.copy_(a); torch.cuda.synchronize()
        s = torch.cuda.Event(enable_timing=True); e = torch.cuda.Event(enable_timing=True)
        s.record()
        for _ in range(10):
            b.copy_(a)
        e.record(); e.synchronize()
        res["peer_copy_GBps"] = 10 * a.numel() * 4 / (s.elapsed_time(e) / 1e3) / 1e9
print(json.dumps(res))
"""


def run_cmd(cmd, timeout=20, env=None):
    """``(returncode, stdout, stderr)``; returncode None when it could not run."""
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)
        return r.returncode, r.stdout, r.stderr
    except (OSError, subprocess.TimeoutExpired) as e:
        return None, "", f"{type(e).__name__}: {e}"


def ptxas() -> dict:
    try:
        import triton.backends.nvidia as nv
    except Exception as e:  # noqa: BLE001
        return dict(error=f"triton.backends.nvidia: {type(e).__name__}: {e}")
    path = os.environ.get("TRITON_PTXAS_PATH") or os.path.join(os.path.dirname(nv.__file__),
                                                                "bin", "ptxas")
    rc, out, err = run_cmd([path, "--version"])
    m = re.search(r"release (\d+)\.(\d+)", out or "")
    return dict(path=path, version=f"{m.group(1)}.{m.group(2)}" if m else None,
                raw=(out or err).strip().splitlines()[-1:] if (out or err) else None)


def smi() -> dict:
    """What nvidia-smi reads of every GPU (clocks, power, modes), and NVLink."""
    q = ("name,driver_version,pci.bus_id,memory.total,clocks.sm,clocks.mem,clocks.max.sm,"
         "clocks.max.mem,power.draw,power.limit,temperature.gpu,persistence_mode,compute_mode,"
         "mig.mode.current")
    rc, out, err = run_cmd(["nvidia-smi", f"--query-gpu={q}", "--format=csv,noheader"])
    if rc != 0 or not out.strip():
        return dict(error=f"nvidia-smi: {(err or 'no output').strip()[:200]}")
    gpus = [dict(zip(q.split(","), [v.strip() for v in line.split(",")]))
            for line in out.strip().splitlines()]
    res = dict(gpus=gpus)
    rc, out, _ = run_cmd(["nvidia-smi"])
    m = re.search(r"CUDA Version:\s*([\d.]+)", out or "")
    res["cuda_version"] = m.group(1) if m else None
    rc, out, _ = run_cmd(["nvidia-smi", "nvlink", "-s", "-i", "0"])
    speeds = [float(x) for x in re.findall(r"Link \d+: ([\d.]+) GB/s", out or "")]
    res["nvlink_links"] = len(speeds)
    res["nvlink_GBps"] = sum(speeds) or None
    return res


def tools() -> dict:
    """Where the optional tools are (None: not on PATH)."""
    from ...mps import control_program
    ncu = shutil.which("ncu")
    if ncu is None:
        for c in sorted(_glob("/opt/nvidia/nsight-compute/*/ncu"), reverse=True) + \
                sorted(_glob("/usr/local/cuda*/bin/ncu"), reverse=True):
            ncu = c
            break
    return dict(ncu=ncu, mps_control=shutil.which(control_program()))


def _glob(pattern):
    import glob
    return glob.glob(pattern)


def _ver(s):
    try:
        return tuple(int(x) for x in s.split(".")[:2])
    except (AttributeError, ValueError):
        return None


def probe(env: dict | None = None) -> dict:
    """The GPU probe in a subprocess (``env`` added to its environment: an MPS client)."""
    # from a file: Triton before 3.9 refuses @jit functions defined in `python -c` code
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "gpu_check_probe.py")
        with open(path, "w") as f:
            f.write(_PROBE)
        rc, out, err = run_cmd([sys.executable, path], timeout=180,
                               env=dict(os.environ, **(env or {})))
    try:
        return json.loads(out.strip().splitlines()[-1])
    except (ValueError, IndexError):
        return dict(error=f"probe failed (rc {rc}): {err.strip()[-600:]}")


def _no_cuda_reason(pr: dict) -> str:
    """Why the probe saw no CUDA device, from what it recorded."""
    if pr.get("error"):
        return pr["error"]
    if "torch_cuda" in pr and pr["torch_cuda"] is None:
        return "torch is a CPU-only build"
    if pr.get("driver_cuda_error"):
        return f"no NVIDIA driver: {pr['driver_cuda_error']}"
    return "is_available False: no visible GPU (CUDA_VISIBLE_DEVICES?)"


def preflight(interpret: bool) -> dict:
    """``verdict`` is ``ok`` or ``CANNOT RUN: reasons``; ``warnings`` lists what may distort
    the numbers. MPS is started later (the check needs the GPUs' compute modes first)."""
    if interpret:
        return dict(verdict="ok", summary="no GPU (interpret mode)", warnings=[], problems=[],
                    tools=tools())
    pf = dict(ptxas=ptxas(), nvidia_smi=smi(), tools=tools())
    pf["probe"] = probe()
    probs, warns = [], []
    pr = pf["probe"]
    if not pr.get("cuda_available"):
        probs.append(f"torch sees no CUDA device ({_no_cuda_reason(pr)})")
    drv = _ver(pr.get("driver_cuda") or pf["nvidia_smi"].get("cuda_version"))
    px = _ver(pf["ptxas"].get("version"))
    if px is None:
        probs.append(f"Triton's ptxas did not answer --version ({pf['ptxas']})")
    elif drv is None:
        warns.append("CUDA driver version unknown")
    elif px[0] > drv[0]:
        probs.append(f"Triton's ptxas is CUDA {px[0]}.{px[1]} but the driver supports CUDA "
                     f"{drv[0]}.{drv[1]}: kernels it builds will not load (set "
                     f"TRITON_PTXAS_PATH to a ptxas <= the driver's CUDA)")
    elif px > drv:
        warns.append(f"ptxas CUDA {px[0]}.{px[1]} newer than the driver's {drv[0]}.{drv[1]}")
    smoke = pr.get("triton_smoke")
    if pr.get("cuda_available") and smoke != "ok":
        probs.append(f"a tiny Triton kernel did not run: {smoke}")
    gpus = pf["nvidia_smi"].get("gpus") or []
    for i, g in enumerate(gpus):
        mig = g.get("mig.mode.current", "")
        if g.get("compute_mode", "") == "Prohibited":
            probs.append(f"GPU {i} compute mode Prohibited")
        if mig == "Enabled":
            probs.append(f"GPU {i} has MIG enabled: CUDA IPC between processes is not "
                         f"supported on MIG instances")
    n = pr.get("device_count") or 0
    pa = pr.get("peer_access") or []
    pf["multi_gpu"] = n >= 2 and all(all(row[:2]) for row in pa[:2])
    if n >= 2 and not pf["multi_gpu"]:
        warns.append("GPUs 0 and 1 have no peer access: no 2-GPU world")
    if not pf["tools"]["ncu"]:
        warns.append("no ncu (Nsight Compute): no kernel profile")
    names = ", ".join(d["name"] for d in pr.get("devices", []))
    pf.update(problems=probs, warnings=warns,
              verdict="ok" if not probs else "CANNOT RUN: " + "; ".join(probs),
              summary=(f"{n} GPU(s){' ' + names if names else ''}, "
                       f"driver CUDA {pr.get('driver_cuda')}, ptxas "
                       f"{pf['ptxas'].get('version')}, NCCL {pr.get('nccl')}"))
    return pf


def compute_modes(pf: dict) -> list[str]:
    return [g.get("compute_mode", "") for g in (pf.get("nvidia_smi") or {}).get("gpus", [])]


def environment(interpret: bool) -> dict:
    import importlib.metadata as md

    import torch

    env = dict(python=platform.python_version(), platform=platform.platform(),
               torch=torch.__version__, torch_cuda=torch.version.cuda,
               cpu_count=os.cpu_count(), mode="interpret" if interpret else "gpu")
    try:
        env["triton"] = md.version("triton")
    except md.PackageNotFoundError:
        env["triton"] = None
    return env

"""The GPU check: every kernel family checked and timed on one GPU machine in one call.

    python scripts/gpu_check.py                 # a GPU: 2 and 4 ranks sharing cuda:0 (MPS)
    python scripts/gpu_check.py --interpret     # the CPU dry run (Triton interpreter)

Phases, in priority order (:data:`PHASES`: name, share of the worlds' budget, what it does;
one module each, ``run(rk, deadline) -> records`` on every rank, ``rk`` a
:class:`.rank.RankCheck`):

=============  ======  ==========================================================================
preflight      parent  the machine, the driver against Triton's ptxas, compute/MIG modes, tools
(mps)          parent  an MPS control daemon for the ranks sharing a GPU (:mod:`tilecomm.mps`)
correctness    0.26    the case table, rows never passed on a GPU first (plan kernel, rs ring)
bits           0.07    random floats: fused vs plan kernel vs rank-order reference, bit for bit
determinism    0.02    deterministic mode's bits
sequence       0.03    back-to-back calls of different kernels, then every result verified
timing         0.27    every collective 8 B - 256 MB, eager and CUDA graph, vs NCCL, symm_mem
latency        0.03    8 KB all_reduce per call vs a copy + host barrier
graph          0.02    an all_reduce captured in a CUDA graph, replays checked
moe            0.14    dispatch/combine vs the reference; timed vs permute + NCCL all_to_all
overlap        0.10    fused all_gather_matmul / matmul_reduce_scatter vs unfused, both copies
kv             0.06    KV transfer, both copy paths and fp8, exact; a 64-block request vs a copy
profile        parent  Nsight Compute on the hottest kernels (after MPS stops)
=============  ======  ==========================================================================

Worlds run one after another (2 then 4 ranks on ``cuda:0``; a 2-GPU world where two GPUs see
each other); within a world each phase gets its share of the time left (:mod:`.worlds`). The
records (:mod:`.records`: one format) go to ``gpu_check.json`` and ``gpu_check.txt`` in the
output folder. Exit status: 0 PASS, 1 FAIL, 2 INCOMPLETE, 3 CANNOT RUN. Nothing of the GPU's
settings is changed (compute mode, clocks, MIG are only read).
"""

from __future__ import annotations

import json
import os
import tempfile
import time

from .config import config
from .records import EXIT, summarize, text_report

#: the rank phases in order, with their shares of a world's budget
PHASES = [("correctness", 0.26), ("bits", 0.07), ("determinism", 0.02), ("sequence", 0.03),
          ("timing", 0.27), ("latency", 0.03), ("graph", 0.02), ("moe", 0.14),
          ("overlap", 0.10), ("kv", 0.06)]
#: phases that only time (skipped where ranks sharing a GPU could not get MPS)
TIMING_PHASES = ("timing", "latency")
#: share of the whole budget the profile phase keeps (after the worlds)
PROFILE_SHARE = 0.08


def _worlds(cfg: dict, pf: dict) -> list[tuple[int, str]]:
    worlds = [(int(w), d) for w, d in cfg["worlds"]]
    if not cfg["interpret"] and pf.get("multi_gpu") and not cfg.get("worlds_given"):
        worlds.append((2, "cuda"))                  # rank r on cuda:r: the 2-GPU world
    return worlds


def _bounds(pf: dict) -> dict:
    probe = pf.get("probe") or {}
    return dict(nvlink_GBps=(pf.get("nvidia_smi") or {}).get("nvlink_GBps"),
                peer_copy_GBps=probe.get("peer_copy_GBps"))


def _coop(pf: dict) -> str | None:
    """What the latest probe said of a cooperative launch (under MPS when it ran as a client)."""
    probe = pf.get("mps_probe") or pf.get("probe") or {}
    return probe.get("cooperative_smoke")


def _launch_env(pf: dict) -> dict:
    """Plain launches for the ranks where the probe ran a kernel but not cooperatively."""
    probe = pf.get("mps_probe") or pf.get("probe") or {}
    if probe.get("triton_smoke") == "ok" and _coop(pf) not in (None, "ok"):
        return {"TILECOMM_GPU_COOPERATIVE": "0"}
    return {}


def run_check(cfg: dict, out_dir: str, setup=None, log=print) -> tuple[dict, int]:
    """The whole check; results written to ``out_dir``; returns ``(results, exit status)``.
    ``setup(comm)`` runs first on every rank (tests register a deliberately broken kernel)."""
    from ...mps import MpsDaemon, ranks_per_device
    from ...settings import settings
    from . import preflight as P, profile
    from .baselines import rank_env
    from .kernels import registered
    from .worlds import run_world

    t0 = time.time()
    interpret = cfg["interpret"]
    if interpret:      # before any triton import here (ranks fork from this process)
        os.environ["TRITON_INTERPRET"] = "1"
    os.environ["TILECOMM_DEVICE_TIMEOUT"] = str(cfg["device_timeout"])
    settings.cache_clear()
    os.makedirs(out_dir, exist_ok=True)
    _heap(cfg)
    phases = [(n, s) for n, s in PHASES if not cfg.get("phases") or n in cfg["phases"]]
    res = dict(env=P.environment(interpret), config=cfg, worlds={}, records=[],
               phases=[dict(name=n, share=s) for n, s in phases], kernels=[])
    pf = res["preflight"] = P.preflight(interpret)
    log(f"[gpu_check] preflight: {pf['summary']}: {pf['verdict']}")
    if pf["verdict"] != "ok":
        res["wall_s"] = time.time() - t0
        res.update(verdict="CANNOT RUN", all_correct=False, skipped_cases=0,
                   correctness_summary={})
        return _write(res, out_dir, log), EXIT["CANNOT RUN"]
    fused, plans = registered(cfg)
    res["kernels"] = [f"{o}/{a}" for o, a in fused] + [f"{o}/{a}/plan" for o, a in plans]
    worlds = _worlds(cfg, pf)
    count = (pf.get("probe") or {}).get("device_count") or 1
    sharing = max(ranks_per_device(w, count, d) for w, d in worlds)
    want_mps = cfg.get("mps", "auto")
    if want_mps == "auto":
        want_mps = settings().mps
    use_mps = want_mps == "on" or (want_mps == "auto" and not interpret and sharing > 1)
    budget = cfg["budget"]
    prof_s = budget * PROFILE_SHARE if cfg.get("profile") else 0.0
    with tempfile.TemporaryDirectory(prefix="gpu_check_") as work:
        for i, (w, device) in enumerate(worlds):
            key = str(w) if device in ("cpu", "cuda:0") else f"{w}@{device}"
            left = budget - prof_s - (time.time() - t0)
            # bigger worlds get more; the first also pays for compiling the kernels
            weight = [x + 4 + (4 if i == 0 and j == 0 else 0)
                      for j, (x, _) in enumerate(worlds[i:])]
            per_world = left * weight[0] / sum(weight)
            if per_world < 5:
                res["worlds"][key] = "skipped: budget spent"
                continue
            mps = MpsDaemon(ranks_per_device(w, count, device),
                            compute_modes=P.compute_modes(pf), log=log)
            if use_mps:
                mps.start()
                if not mps.state.active:
                    log(f"[gpu_check] MPS: {mps.state.reason}: ranks time-slice the GPU "
                        f"(correct, but no speed figure)")
                else:
                    pf["mps_probe"] = P.probe(mps.rank_env())
            extra = _launch_env(pf)
            if extra:
                res.setdefault("notes", []).append(
                    f"world {key}: a cooperative launch failed in the probe "
                    f"({_coop(pf)}): the ranks launch plainly (TILECOMM_GPU_COOPERATIVE=0)")
            res["mps"] = mps.state.as_dict()
            log(f"[gpu_check] world {key} ({device}): {per_world:.0f} s budget")
            cfg_w = dict(cfg, bounds=dict(_bounds(pf), gpus=1 if device != "cuda" else count))
            run_phases = phases
            if use_mps and not mps.state.active and ranks_per_device(w, count, device) > 1:
                # time slices: correct, but every timing would be the scheduler's quantum
                cfg_w["timings"] = False
                run_phases = [(n, s) for n, s in phases if n not in TIMING_PHASES]
                res.setdefault("notes", []).append(
                    f"world {key}: no MPS ({mps.state.reason}): correctness only, no timing")
            try:
                summary, status = run_world(w, device, cfg_w, per_world, work, run_phases,
                                            dict(rank_env(), **mps.rank_env(), **extra),
                                            setup, log)
            finally:
                mps.stop()
                res["mps"] = mps.state.as_dict()
            res["worlds"][key] = status
            res["records"] += summary.get("records", [])
            res.setdefault("cta_budget", {})[key] = summary.get("cta_budget")
            res.setdefault("rank_env", {})[key] = summary.get("rank_env")
            for name, t in (summary.get("phases") or {}).items():
                res.setdefault("phase_times", {}).setdefault(name, {})[key] = t
            if summary.get("traceback"):
                res.setdefault("tracebacks", {})[key] = summary["traceback"]
        res["profile"] = profile.run(cfg, pf["tools"].get("ncu"), out_dir,
                                     budget - (time.time() - t0), work, log)
    res["wall_s"] = time.time() - t0
    summarize(res)
    return _write(res, out_dir, log), EXIT[res["verdict"]]


def _write(res: dict, out_dir: str, log) -> dict:
    res.setdefault("wall_s", 0.0)
    with open(os.path.join(out_dir, "gpu_check.json"), "w") as f:
        json.dump(res, f, indent=1, default=str)
    text = text_report(res)
    with open(os.path.join(out_dir, "gpu_check.txt"), "w") as f:
        f.write(text + "\n")
    log(text)
    return res


def main(argv=None) -> int:
    import argparse

    p = argparse.ArgumentParser(
        description="Check and time every GPU kernel family on this machine in one call "
                    "(preflight, correctness, bits, determinism, sequence, timing vs NCCL "
                    "and symm_mem, latency, CUDA graphs, MoE, fused ops, an ncu profile); "
                    "writes gpu_check.json and gpu_check.txt.")
    p.add_argument("--interpret", action="store_true",
                   help="CPU dry run: Triton interpreter, 2 CPU ranks, small sizes")
    p.add_argument("--worlds", default=None, help="comma-separated world sizes (default 2,4)")
    p.add_argument("--budget", type=float, default=None,
                   help="seconds for the whole check (default 390 on a GPU, 600 interpret)")
    p.add_argument("--out", default=None, help="output folder (default $OUT or ./gpu_check_out)")
    p.add_argument("--kernels", default=None,
                   help="comma-separated op/algo to check (default: every registered one)")
    p.add_argument("--phases", default=None,
                   help=f"comma-separated rank phases to run (default all: "
                        f"{','.join(n for n, _ in PHASES)})")
    p.add_argument("--mps", choices=("auto", "on", "off"), default=None,
                   help="run ranks sharing a GPU under MPS (default auto: when they share one)")
    p.add_argument("--no-profile", action="store_true", help="skip the ncu profile")
    p.add_argument("--device-timeout", type=float, default=None,
                   help="seconds a device wait polls before giving up (default 5)")
    a = p.parse_args(argv)
    cfg = config(a.interpret)
    if a.worlds:
        dev = "cpu" if a.interpret else "cuda:0"
        cfg["worlds"] = [[int(x), dev] for x in a.worlds.split(",")]
        cfg["worlds_given"] = True
    cfg["kernels"] = a.kernels.split(",") if a.kernels else None
    if a.budget:
        cfg["budget"] = a.budget
    if a.mps:
        cfg["mps"] = a.mps
    if a.no_profile:
        cfg["profile"] = False
    if a.phases:
        names = a.phases.split(",")
        unknown = [n for n in names if n not in dict(PHASES)]
        if unknown:
            p.error(f"unknown phase(s) {unknown}; choose from {[n for n, _ in PHASES]}")
        cfg["phases"] = names
    cfg["device_timeout"] = a.device_timeout or cfg["device_timeout"]
    out_dir = a.out or os.environ.get("OUT") or "./gpu_check_out"
    _, code = run_check(cfg, out_dir, log=lambda s: print(s, flush=True))
    return code


def _heap(cfg: dict) -> None:
    """Each rank's CUDA heap: every kernel keeps its own scratch (two halves, grown to its
    largest call) for the table's staged calls, plus the sweep's heap tensors (input and
    output) and their scratch."""
    table = max(cfg["check_sizes"] + cfg["time_sizes"])
    cfg.setdefault("device_heap_bytes",
                   max(1 << 30, 32 * table + 8 * max(cfg["sweep_sizes"]) + (256 << 20)))


__all__ = ["PHASES", "config", "run_check", "main"]

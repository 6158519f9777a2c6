"""One world of the check: ``w`` rank processes on a device, every rank phase in order.

The phases of a world share its budget by their shares (:data:`tilecomm.bench.gpucheck.
PHASES`): each starts with ``share / (shares still to run)`` of the time left, so what a phase
leaves unused goes to the next ones and a phase that runs out is cut (its remaining cases are
recorded as skipped) without starving the others. Rank 0 appends every record to a partial
file as it goes, so a world that dies still reports what ran.

The ranks get the MPS daemon's environment and the baselines' (before CUDA starts), and leave
cleanly when stopped (SIGTERM, then a kill after the device timeout): a killed MPS client can
wedge the server for the other ranks.
"""

from __future__ import annotations

import gc
import importlib
import json
import os
import threading
import time
import traceback


def rank_task(comm, cfg: dict, device: str, partial: str, deadline: float, phases: list,
              setup=None) -> dict | None:
    """Everything one rank does in one world; rank 0 returns the records."""
    if cfg["interpret"]:
        os.environ["TRITON_INTERPRET"] = "1"
    from .rank import RankCheck
    out = dict(world=comm.world_size, device=device, records=[], phases={})
    try:
        if setup is not None:
            setup(comm)
        rk = RankCheck(comm, cfg, device, partial)
    except Exception as e:  # noqa: BLE001 - e.g. no CUDA IPC: reported for the whole world
        return dict(out, fatal=f"{type(e).__name__}: {e}", traceback=traceback.format_exc())
    out["cta_budget"] = _budget(rk)
    #: what rank 0's process was given for sharing the GPU (MPS) and for the baselines
    out["rank_env"] = {k: v for k, v in os.environ.items()
                       if k.startswith(("CUDA_MPS_", "NCCL_MULTI_RANK", "TORCH_SYMM_MEM"))}
    mods = {name: importlib.import_module(f"{__package__}.{name}") for name, _ in phases}
    # What exists now (torch, triton, the kernels, the phases) lives as long as the rank: kept
    # out of the collector's sight, the gc.collect() after every row (symmetric buffers must be
    # freed in step on every rank) costs microseconds instead of ~70 ms with triton loaded.
    gc.collect()
    gc.freeze()
    left = list(phases)
    reserve = 2.0
    while left:
        name, share = left.pop(0)
        now = time.time()
        span = max(0.0, deadline - reserve - now)
        t_end = now + span * share / (share + sum(s for _, s in left))
        mod = mods[name]
        t0 = time.time()
        recs = mod.run(rk, t_end)
        out["records"] += recs
        out["phases"][name] = dict(budget_s=round(t_end - now, 1),
                                   spent_s=round(time.time() - t0, 1), records=len(recs))
    comm.barrier()
    return out if comm.rank == 0 else None


def _budget(rk) -> dict:
    """The CTA budget the collectives' kernels got (NOTE [CTA budget]), for the report."""
    from ...device.budget import cta_budget
    b = cta_budget(rk.comm.exchange, rk.dev, interpret=rk.cfg["interpret"])
    return dict(ctas=b.ctas, sharing=b.sharing, source=b.source)


def run_world(w: int, device: str, cfg: dict, budget_s: float, work_dir: str, phases: list,
              env: dict, setup=None, log=print) -> tuple[dict, str]:
    """Run the rank phases on a fresh group of ``w`` ranks with a watchdog; returns
    ``(summary, status)``."""
    import tilecomm

    tag = f"w{w}_{device.replace(':', '')}"
    partial = os.path.join(work_dir, f"{tag}.jsonl")
    cfg = dict(cfg, store=os.path.join(work_dir, f"{tag}.store"))
    deadline = time.time() + budget_s
    group = tilecomm.RankGroup(w, timeout=60, heap_bytes=64 << 20, scratch_bytes=1 << 20,
                               env=env, leave_grace=cfg["device_timeout"] + 5)
    killed = threading.Event()

    def watchdog():
        killed.set()
        group.stop()

    timer = threading.Timer(budget_s + 30, watchdog)      # ranks check the deadline; this is
    timer.daemon = True                                    # for a rank stuck past it
    status, summary = "ok", None
    try:
        group.start()
        timer.start()
        res = group.run(rank_task, cfg, device, partial, deadline, phases, setup)
        summary = res[0]
        if summary and summary.get("fatal"):
            status = "failed: " + summary["fatal"]
    except BaseException as e:  # noqa: BLE001 - one world failing is reported
        status = ("killed by the watchdog" if killed.is_set() else "failed") + \
            f": {type(e).__name__}: {str(e)[:500]}"
        others = getattr(e, "others", None)
        if others:      # every failing rank's own error, not only the first
            status += "; " + "; ".join(f"rank {r}: {f[0]}: {str(f[1])[:200]}"
                                       for r, f in sorted(others.items()))
    finally:
        timer.cancel()
        group.stop()
    if summary is None or summary.get("fatal"):      # what rank 0 logged before the failure
        summary = dict(summary or {}, world=w, records=[])
        if os.path.exists(partial):
            with open(partial) as f:
                summary["records"] = [json.loads(line) for line in f]
    log(f"[gpu_check] world {w} ({device}): {status}")
    return summary, status

"""``tilecomm tune``: measure what the cost model needs on this machine and layout, and fit it.

* **One host** (``-n N``): all_reduce with ``one_shot`` and ``ring`` (the shared-memory model's
  calibration algorithms, ``sim/cpu_loop.py`` :data:`CALIB_ALGOS`) on :data:`HOST_SIZES`, the
  caller's memory and heap memory, timed by the bench harness; ``cpu_loop.fit`` turns them
  into this machine's :class:`~tilecomm.topology.spec.ShmCost` (seven parameters and a cache
  size for every collective and algorithm). ``two_shot`` at the sizes in between is timed
  too and never fitted on: its median error is the fit's held-out score.
* **Simulated hosts** (``--hosts H -n N``): every candidate ``auto`` has across hosts
  (``hier_*`` and ``engine``) for each collective at :data:`HOSTS_SIZES`; the medians become
  :class:`~tilecomm.tuning.curves.Curve` s for this layout.

What the bench harness reports is a median over rounds of the slowest rank's mean call time,
so the fit sees the same numbers ``tilecomm bench`` prints.
"""

from __future__ import annotations

import statistics
from dataclasses import asdict

from ..sim import cpu_loop
from .costs import ENGINE, curve_key

#: one host: the calibration sizes (x16 steps) and the held-out ones between them
HOST_SIZES = (16, 256, 4 << 10, 64 << 10, 1 << 20, 16 << 20)
HELD_OUT_SIZES = (64, 1 << 10, 16 << 10, 256 << 10, 4 << 20)
#: across hosts: the curves' points (x16 steps, 8 B .. 16 MiB)
HOSTS_SIZES = (8, 128, 2 << 10, 32 << 10, 512 << 10, 8 << 20)
#: timed calls per round across hosts
HOSTS_ITERS = 8
HOSTS_COLLECTIVES = ("all_reduce", "all_gather", "reduce_scatter", "broadcast", "reduce",
                     "all_to_all")


class SlowLaunch(RuntimeError):
    """A sweep launch ran in the machine's slow state (NOTE [the slow launch]): not fitted."""


def _bench(progress=None, **kw) -> list[dict]:
    from ..bench import BenchConfig, runner
    from ..bench.machine import SLOW_RATIO
    cfg = BenchConfig(bound=False, rounds=kw.pop("rounds", 3), **kw)
    rows = runner.run(cfg, progress)
    slow = [r for r in rows if r.get("machine_slow")]
    if slow:    # never fit on it: its every call is several times slower than the machine's
        raise SlowLaunch(f"a {cfg.op} sweep launch ran in the machine's slow state (rewriting "
                         f"memory a peer core read: x{slow[0]['machine_ratio']:.0f} a local "
                         f"copy, slow above x{SLOW_RATIO:g}); nothing was stored. Rerun "
                         f"`tilecomm tune` later (NOTE [the slow launch], bench/machine.py)")
    return rows


def one_host(ranks: int, progress=None) -> tuple[dict, dict]:
    """Fit the shared-memory model on ``ranks`` ranks of this machine; returns the store
    entries and a report (``fit_rms``, ``held_out_median``: relative errors)."""
    from ..settings import settings
    s = settings()
    single = s.cma_min_bytes if s.cma else 0
    calib, held = [], []
    for mem in ("user", "heap"):
        calib += cpu_loop.rows_of(_bench(progress, op="all_reduce", world_size=ranks,
                              sizes=list(HOST_SIZES), algos=list(cpu_loop.CALIB_ALGOS), mem=mem))
        held += cpu_loop.rows_of(_bench(progress, op="all_reduce", world_size=ranks,
                             sizes=list(HELD_OUT_SIZES), algos=["two_shot"], mem=mem))
    fit = cpu_loop.fit(calib, s.piece_bytes, single_copy_min=single)
    errs = [cpu_loop.predict_row(fit.params, r) / r.time_us - 1 for r in held]
    report = {"ranks": ranks, "fit_rows": fit.rows, "fit_rms": fit.rms_rel,
              "held_out_rows": len(held),
              "held_out_median": statistics.median(abs(e) for e in errs),
              "held_out": [[r.algo, r.mem, r.nbytes, r.time_us,
                            cpu_loop.predict_row(fit.params, r)] for r in held]}
    entry = {"params": asdict(fit.params), "report": report}
    return {"shm": {ranks: entry}}, report


def hosts(per_host: list[int], progress=None) -> tuple[dict, dict]:
    """Measure every inter-host candidate of each collective on simulated hosts; returns the
    store entries (curves) and the rows."""
    from ..bench.runner import candidates
    from ..bench import BenchConfig
    from ..hier.layout import HostLayout
    lay = HostLayout.sizes(*per_host)
    w = lay.world_size
    curves, all_rows = {}, []
    for op in HOSTS_COLLECTIVES:
        algos = candidates(BenchConfig(op=op, world_size=w, hosts=list(per_host)))
        # calls across simulated hosts take 1-20 ms: a few per round are enough, and the
        # bench's own count (hundreds for small calls) would take minutes
        rows = _bench(progress, op=op, world_size=w, hosts=list(per_host),
                      sizes=list(HOSTS_SIZES), algos=algos, iters=HOSTS_ITERS, warmup=2)
        all_rows += rows
        for a in algos:
            pts = [(int(r["bytes"]), float(r["time_us"])) for r in rows if r["algo"] == a]
            if pts:
                curves[curve_key(lay, op, a)] = [list(p) for p in sorted(pts)]
    return {"curves": curves}, {"rows": all_rows, "engine": ENGINE}

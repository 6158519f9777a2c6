"""Phase ``correctness``: every row of the case table (:func:`.kernels.correctness_table`:
every fused kernel in every dtype, reduction and memory kind, every schedule on the plan
kernel), rows that never passed on a GPU first.

Per row, two consecutive calls, each on fresh random small integers (exact in every dtype),
outputs poisoned, roots and all_to_all_v splits (zeros too) drawn per call, compared exactly
with the reference of every rank's inputs (``bench.runner.check_case``). A failing row is
recorded with the failing rank's error and the ranks re-align; the rest still runs. Every
kernel is called once first, unjudged, so compiling is not charged to the first row.
"""

from __future__ import annotations

import time

from ..cases import BenchCase
from . import kernels as K


def warm(rk, fused: dict, plans: dict) -> float:
    """Every kernel once (compiles; not judged); seconds spent."""
    t0 = time.perf_counter()
    for name, keys in (("fused", fused), ("plan", plans)):
        with K.engine(name):
            for (op, algo) in keys:
                case = BenchCase(op, algo, "float32", 4096, "user", "sum", rk.w, name)
                try:
                    bufs = rk.runner.make_buffers(rk.comm, case, rk.dev)
                    rk.runner.check_case(rk.comm, case, bufs, rk.dev, calls=1)
                    ok = True
                except Exception:  # noqa: BLE001 - judged by the table rows
                    ok = False
                bufs = None
                if not all(s[0] for s in rk.gather([int(ok)])):
                    rk.recover()
    return round(time.perf_counter() - t0, 3)


def run(rk, deadline: float) -> list[dict]:
    fused, plans = K.registered(rk.cfg)
    table = K.correctness_table(rk.cfg, rk.w, fused, plans)
    out = [dict(phase="correctness", case=f"warm-up/w{rk.w}", kernel="warm-up", world=rk.w,
                ok=True, seconds=warm(rk, fused, plans), calls=len(fused) + len(plans))]
    for i, case in enumerate(table):
        rec = K.record(rk.runner, case, "correctness")
        rec["first"] = K.first(case)
        if not rk.in_time(deadline):
            out.append(rk.skipped(rec))
            continue

        def fn(case=case, i=i):
            bufs = rk.runner.make_buffers(rk.comm, case, rk.dev)
            with K.engine(case.engine):
                return rk.runner.check_case(rk.comm, case, bufs, rk.dev, seed=100 + i, calls=2)
        rec = rk.judged(rec, fn)
        out.append(rec)
        rk.log(rec)
    return out

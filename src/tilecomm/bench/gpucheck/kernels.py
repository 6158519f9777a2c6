"""Which kernels the check covers and the case tables built from them (ids as ``tilecomm
bench``'s: ``tilecomm.bench.cases``).

* the fused kernels: ``registry.KERNELS`` (every collective/algorithm with a hand-fused GPU
  kernel), every dtype and reduction each registers;
* the plan kernel: every registered schedule through the generic plan kernel (fused kernels
  off), whose rows end in ``/plan``.

Rows that have never passed on a GPU come first in the correctness table (:data:`FIRST`), the
rest after them as a regression check, so a short budget spends itself on what is unknown.
"""

from __future__ import annotations

import contextlib

from ...algorithms.registry import algorithms
from ...backends.triton import registry
from ..cases import CASES, BenchCase, kernel_table, redop_applies

#: (collective/algorithm) whose fused rows had not run on a GPU when the check was last
#: changed; every plan-kernel row is in the same situation (an H200 ran 802 of 1790 rows,
#: none of these)
FIRST = ("reduce_scatter/ring",)


def registered(cfg: dict) -> tuple[dict, dict]:
    """``(fused kernels, plan-kernel specs)`` keyed by ``(op, algo)``, limited to
    ``cfg["kernels"]`` (``op/algo`` for a fused kernel, ``op/algo/plan`` or ``op/algo`` for a
    schedule on the plan kernel) when it is set."""
    pick = cfg.get("kernels")
    fused = {k: v for k, v in sorted(registry.load().items())
             if not pick or f"{k[0]}/{k[1]}" in pick}
    plans = {}
    for op in CASES:
        for a in algorithms(op):
            spec = registry.plan_spec(op, a)
            if spec is not None and (not pick or f"{op}/{a}" in pick
                                     or f"{op}/{a}/plan" in pick):
                plans[(op, a)] = spec
    return fused, plans


@contextlib.contextmanager
def engine(name: str):
    """Route the calls inside the block to the plan kernel (``plan``: fused kernels off) or
    to the fused kernels (anything else: the setting's choice)."""
    registry.FUSED = False if name == "plan" else None
    try:
        yield
    finally:
        registry.FUSED = None


def first(case: BenchCase) -> bool:
    """A row whose kernel has never passed on a GPU."""
    return case.engine == "plan" or case.kernel in FIRST


def correctness_table(cfg: dict, w: int, fused: dict, plans: dict) -> list[BenchCase]:
    """Every fused kernel x dtype x reduction x memory kind at the configured sizes, and every
    schedule on the plan kernel (float32 and bfloat16, sum and avg); :func:`first` rows first
    (in table order within each part)."""
    rows = kernel_table(fused, w, cfg["check_sizes"], full_sizes=cfg["full_sizes"],
                        mix_mems=cfg["mix_mems"], dtypes=cfg.get("dtypes"),
                        cover=cfg.get("cover", False))
    rows += kernel_table(plans, w, cfg["check_sizes"], full_sizes=cfg["plan_sizes"],
                         mix_mems=True, dtypes=["float32", "bfloat16"],
                         redops=["sum", "avg"], engine="plan")
    return [c for c in rows if first(c)] + [c for c in rows if not first(c)]


def timing_table(cfg: dict, w: int, fused: dict) -> list[BenchCase]:
    """Every fused kernel at the timing sizes, float32 sum, both memory kinds."""
    return kernel_table(fused, w, cfg["time_sizes"], dtypes=["float32"], redops=["sum"])


def bits_table(cfg: dict, w: int, fused: dict, plans: dict) -> list[BenchCase]:
    """Reducing collectives on random floats: every fused kernel (fp32/bf16/fp16, sum and avg)
    against its plan-kernel twin, and the rank-ordered schedules that have no fused kernel
    against the host reference (``engine="bits"``)."""
    import torch

    from ...algorithms.lower import deterministic_algorithms
    rows, turn = [], 0
    for (op, algo), plan in sorted(plans.items()):
        if not CASES[op].reduces:
            continue
        spec = fused.get((op, algo))
        if spec is None and algo not in deterministic_algorithms(op, w):
            continue        # nothing to compare the plan kernel's bits with
        spec = spec or plan
        for dt in ("float32", "bfloat16", "float16"):
            if getattr(torch, dt) not in spec.dtypes:
                continue
            for red in ("sum", "avg"):
                if red not in spec.ops or not redop_applies(dt, red):
                    continue
                for n in cfg["bits_sizes"]:
                    mem, turn = ("user", "heap")[turn % 2], turn + 1
                    rows.append(BenchCase(op, algo, dt, n, mem, red, w, "bits"))
    return rows


def record(runner, case: BenchCase, phase: str) -> dict:
    """The fields every record of a case carries."""
    n, _, _ = runner.case_counts(case)
    return dict(phase=phase, case=case.id, kernel=case.kernel, world=case.world,
                dtype=case.dtype, redop=case.redop, mem=case.mem, bytes=case.nbytes, count=n,
                engine=case.engine)

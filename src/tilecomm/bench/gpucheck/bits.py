"""Phase ``bits``: reducing collectives on random floats of mixed magnitudes, where the
reduction order, the accumulation type and the division show in the bits (integer data hides
them). Each fused kernel and its plan-kernel twin run on the same inputs and must give equal
bit patterns, and those of ``reference.rank_order_reduced`` for the rank-ordered schedules
(``lower.deterministic_algorithms``); rank-ordered schedules without a fused kernel are held
to the reference alone."""

from __future__ import annotations

import torch

from ...algorithms.lower import deterministic_algorithms
from ...types import DTYPE_BY_NAME
from ..cases import CASES, POISON, BenchCase, random_data
from . import kernels as K

_AS_INT = {"float32": torch.int32, "bfloat16": torch.int16, "float16": torch.int16}


def bits_of(t: torch.Tensor, dtype: str) -> torch.Tensor:
    # a copy: on CPU tensors .cpu()/.contiguous() return views, and the next engine's call
    # overwrites the buffer (the fused result then read as the plan kernel's)
    return t.detach().reshape(-1).cpu().clone().view(_AS_INT[dtype])


def differ(a: torch.Tensor, b: torch.Tensor) -> int:
    return int(b.numel()) if a.shape != b.shape else int((a != b).sum())


def run(rk, deadline: float) -> list[dict]:
    fused, plans = K.registered(rk.cfg)
    out = []
    for i, case in enumerate(K.bits_table(rk.cfg, rk.w, fused, plans)):
        rec = K.record(rk.runner, case, "bits")
        if not rk.in_time(deadline):
            out.append(rk.skipped(rec))
            continue
        seed = 5000 + i
        root = seed % rk.w
        ordered = case.algo in deterministic_algorithms(case.op, rk.w, root)
        if not ordered and (case.op, case.algo) not in fused:
            root = 0        # plan kernel alone: the root its schedule reduces in rank order
            ordered = case.algo in deterministic_algorithms(case.op, rk.w, root)
        engines = (["fused"] if (case.op, case.algo) in fused else []) + ["plan"]
        rec.update(engines=engines, vs_reference=ordered, root=root)
        detail: list[str] = []

        def fn(case=case, seed=seed, root=root, ordered=ordered, engines=engines,
               detail=detail):
            c = CASES[case.op]
            plain = BenchCase(case.op, case.algo, case.dtype, case.nbytes, case.mem,
                              case.redop, case.world)
            bufs = rk.runner.make_buffers(rk.comm, plain, rk.dev)
            dt = DTYPE_BY_NAME[case.dtype].torch
            inputs = [random_data(seed, j, bufs.inp.numel(), dt) for j in range(rk.w)]
            got = {}
            for eng in engines:
                with K.engine(eng):
                    bufs.inp.copy_(inputs[rk.r])
                    bufs.root, bufs.redop = root, case.redop
                    if bufs.out is not None:
                        bufs.out.fill_(POISON)
                    c.run(rk.comm, bufs, case.algo)
                    rk.sync()
                got[eng] = bits_of(rk.runner.result_of(plain, bufs), case.dtype)
            wrong = 0
            if "fused" in got:
                k = differ(got["fused"], got["plan"])
                if k:
                    detail.append(f"fused vs plan kernel: {k}")
                wrong = max(wrong, k)
            if ordered:
                want = bits_of(c.expected(inputs, rk.r, rk.w, bufs), case.dtype)
                for eng, g in got.items():
                    k = differ(g, want)
                    if k:
                        detail.append(f"{eng} vs rank-order reference: {k}")
                    wrong = max(wrong, k)
            return wrong
        rec = rk.judged(rec, fn)
        if detail:
            rec["error"] = f"bits differ ({'; '.join(detail)} elements)"
        out.append(rec)
        rk.log(rec)
    return out

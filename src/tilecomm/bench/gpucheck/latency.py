"""Phase ``latency``: an 8 KB all_reduce per call (``comm.all_reduce`` on a heap tensor, every
fused all_reduce kernel), eager, against a copy launch plus a host barrier (what a call that
synchronizes on the host costs at least). The same call in a CUDA graph: phase ``graph``."""

from __future__ import annotations

import time

import torch

from ..cases import BenchCase
from . import kernels as K

SIZE = 8192


def _seconds_per_call(rk, fn, n_iter: int) -> float:
    """This rank's seconds per call of ``fn`` (a callable, or a BenchCase the runner times)."""
    if isinstance(fn, BenchCase):           # avg of equal values: no growth, no refill
        bufs = rk.runner.make_buffers(rk.comm, fn, rk.dev)
        return rk.runner.time_case(rk.comm, fn, bufs, rk.dev, 2, n_iter, 1)[0]
    fn()
    rk.comm.barrier()
    t = time.perf_counter()
    for _ in range(n_iter):
        fn()
    return (time.perf_counter() - t) / n_iter


def run(rk, deadline: float) -> list[dict]:
    n_iter = rk.cfg["latency_iters"]
    x = torch.ones(SIZE // 4, device=rk.dev)
    y = torch.empty_like(x)

    def copy_barrier():
        y.copy_(x)
        rk.sync()
        rk.comm.barrier()

    fused, _ = K.registered(rk.cfg)
    fns = [("copy launch + host barrier", copy_barrier)]
    for (op, a) in fused:
        if op == "all_reduce":
            fns.append((f"all_reduce/{a}", BenchCase("all_reduce", a, "float32", SIZE, "heap",
                                                     "avg", rk.w)))
    rec = dict(phase="latency", case=f"latency/all_reduce/8K/w{rk.w}", world=rk.w,
               bytes=SIZE, iters=n_iter, us={}, errors={})
    for name, fn in fns:
        if not rk.in_time(deadline):
            rec["errors"][name] = "skipped: phase budget spent"
            continue
        rk.timed_into(rec, name, lambda fn=fn: [_seconds_per_call(rk, fn, n_iter)], 1)
    rk.log(rec)
    return [rec]

"""Wall and CPU time per call of an all_reduce on every rank (run inside a rank by
``benchmarks/hosts_cpu_accounting.py``): where ranks outnumber cores, a collective is as fast
as the CPU work it needs, so the CPU per call says more than the wall time alone."""

from __future__ import annotations

import time

import torch


def cpu_per_call(comm, nbytes: int, iters: int, which: str) -> tuple[float, float]:
    """``(wall us, CPU us of this process, every thread)`` per back-to-back float32 all_reduce
    of ``nbytes``: ``which`` is "tilecomm" (``comm.all_reduce``, auto), "tilecomm:ALGO" or
    "gloo" (Gloo's allreduce on the world group the hierarchical backend keeps, flat over all
    ranks)."""
    x = torch.randn(max(nbytes // 4, 1))
    if which == "gloo":
        pg = comm._backend.rails_for("cpu").world

        def call():
            pg.allreduce([x]).wait()
    else:
        algo = which.partition(":")[2] or "auto"

        def call():
            comm.all_reduce(x, algo=algo)
    for _ in range(3):
        call()
    comm.barrier()
    t0, c0 = time.perf_counter(), time.process_time()
    for _ in range(iters):
        call()
    t1, c1 = time.perf_counter(), time.process_time()
    comm.barrier()
    return (t1 - t0) / iters * 1e6, (c1 - c0) / iters * 1e6

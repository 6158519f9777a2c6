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
        pg = comm.host.rails("cpu").world

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


def primitive_time(comm, nbytes: int, iters: int, what: str) -> float:
    """Wall us per repetition of one primitive that every rank runs at once (so the timing
    includes the contention of 4 ranks on this machine's cores), on ``nbytes`` of float32:

    * "copy": ``dst.copy_(src)``;
    * "add": ``torch.add(a, b, out=c)`` (reads 2, writes 1);
    * "tcp": this rank sends ``nbytes`` to its rail partner on the other host and receives as
      many from it, both rails at once, by the hierarchical runtime's own rail round
      (:func:`~tilecomm.bench.local_steps.rail_round`).
    """
    n = max(nbytes // 4, 1)
    if what == "copy":
        a, c = torch.randn(n), torch.empty(n)

        def call():
            c.copy_(a)
    elif what == "add":
        a, b, c = torch.randn(n), torch.randn(n), torch.empty(n)

        def call():
            torch.add(a, b, out=c)
    elif what == "tcp":
        from .local_steps import rail_round
        call, _, members = rail_round(comm, 4 * n, 7)
        if len(members) != 2:
            raise ValueError(f"the tcp primitive pairs the ranks of 2 hosts; this rail has "
                             f"{len(members)} members")
    else:
        raise ValueError(f"unknown primitive {what!r}")
    for _ in range(2):
        call()
    comm.barrier()
    t0 = time.perf_counter()
    for _ in range(iters):
        call()
    t1 = time.perf_counter()
    comm.barrier()
    return (t1 - t0) / iters * 1e6

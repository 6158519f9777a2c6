"""Rank side of ``benchmarks/hosts_local.py``: a host's local collective as it runs inside a
hierarchical call, timed alone (calibration data for ``tilecomm.sim.hosts``).

In a hierarchical call every host runs its local step at the same time, right after an
inter-host round. So each timed call here follows a barrier over *all* ranks (a Gloo round
between the hosts: the ranks leave it at different times, as they leave a rail step), and
every host runs the same local collective at once on its own ranks (``comm.host_comm``).
"""

from __future__ import annotations

import time

import torch


def time_local(comm, collective: str, nbytes: int, iters: int) -> list[float]:
    """Seconds per call of ``collective`` on this host's ranks, one per iteration.
    ``nbytes``: the local step's input region (what ``sim/hosts.py`` counts for a Local
    step): the buffer of all_reduce / reduce / broadcast, the input of reduce_scatter, one
    rank's block of all_gather. float32."""
    torch.set_num_threads(1)
    lc = comm.host_comm
    n = max(1, nbytes // 4)
    ranks = lc.world_size
    x = torch.ones(n)
    out_rs = torch.empty(max(1, n // ranks))
    x_rs = torch.ones(out_rs.numel() * ranks)
    out_ag = torch.empty(n * ranks)
    calls = {
        "all_reduce": lambda: lc.all_reduce(x),
        "reduce": lambda: lc.reduce(x, root=0),
        "broadcast": lambda: lc.broadcast(x, root=0),
        "reduce_scatter": lambda: lc.reduce_scatter(x_rs, out=out_rs),
        "all_gather": lambda: lc.all_gather(x, out=out_ag),
    }
    fn = calls[collective]
    fn()
    times = []
    for _ in range(iters):
        comm.barrier()
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
        if collective == "all_reduce":
            x.fill_(1.0)              # keep the sums finite
    return times

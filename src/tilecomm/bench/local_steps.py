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


def rail_round(comm, nbytes: int, tag: int):
    """``(call, rail, members)``: ``call()`` makes one round of ``nbytes`` on this rank's
    (first) rail the way the hierarchical runtime makes its rounds, by calling it
    (``Rails.pairwise``: a Gloo send to and a receive from every other member of the rail
    group, then a wait for all), so a benchmark times the runtime's primitive, not a copy of
    it. ``rail``: the rail's index; ``members``: its global ranks."""
    rails = comm.host.rails("cpu")
    rail = comm.layout.rails_of(comm.rank)[0]
    members = list(comm.layout.rail(rail))
    me = members.index(comm.rank)
    src = torch.ones(max(1, nbytes), dtype=torch.uint8)
    outs = [src if i == me else torch.empty_like(src) for i in range(len(members))]
    pg = rails.groups[rail]

    def call():
        rails.pairwise(pg, members, src, outs, "bench rail round", 0, tag)
    return call, rail, members


def time_rail_after_local(comm, nbytes: int, iters: int, mode: str) -> list[float]:
    """Seconds per rail round of ``nbytes`` that starts right after a local step, one per
    iteration (0.0 on a rank that sits the round out).

    A hierarchical call's first rail round follows a local step, which releases the ranks of
    each host at different times, some of them asleep in their wait; its partner on the other
    host left its own local step at yet another time. Timed alone, back to back, the same
    round costs less (``benchmarks/hosts_link.py``). Here each iteration is a barrier of the
    host's ranks over shared memory (``comm.host_comm``: a local step, as short as one can
    be), then the round as the rails make it (:func:`rail_round`). ``mode`` "both": every
    rail at once (hier_rail); "one": rail 0 only (hier_leader; the others go straight on to
    the next barrier)."""
    one_round, rail, _ = rail_round(comm, nbytes, 5)
    active = mode == "both" or rail == 0
    lc = comm.host_comm
    if active:
        one_round()
    comm.barrier()
    times = []
    for _ in range(iters):
        lc.barrier()
        t0 = time.perf_counter()
        if active:
            one_round()
        times.append(time.perf_counter() - t0 if active else 0.0)
    comm.barrier()
    return times

"""Rank side of ``benchmarks/hosts_pingpong.py``: send/recv ping-pong between two ranks of
different hosts, through the Communicator and through Gloo's own send/recv on the same world
group, in one run (the other ranks wait in a barrier)."""

from __future__ import annotations

import statistics
import time

import torch


def pingpong(comm, a: int, b: int, numel: int, iters: int) -> dict[str, float]:
    """Median round trip (us) of ``a`` -> ``b`` -> ``a`` with ``numel`` float32, on ranks
    ``a`` and ``b`` (empty on the others): ``tilecomm`` and ``gloo`` (the raw world group)."""
    r = comm.rank
    world = comm.host.rails("cpu").world if r in (a, b) else None
    x, y = torch.ones(numel), torch.empty(numel)
    out: dict[str, float] = {}
    for mode in ("tilecomm", "gloo"):
        times = []
        comm.barrier()
        for _ in range(iters if r in (a, b) else 0):
            peer = b if r == a else a
            t0 = time.perf_counter()
            if mode == "tilecomm":
                if r == a:
                    comm.send(x, peer)
                    comm.recv(y, peer)
                else:
                    comm.recv(y, peer)
                    comm.send(x, peer)
            else:
                steps = ((world.send, x), (world.recv, y))
                for fn, t in (steps if r == a else steps[::-1]):
                    fn([t], peer, 7).wait()
            times.append(time.perf_counter() - t0)
        comm.barrier()
        if times:
            out[mode] = statistics.median(times[5:]) * 1e6
    return out

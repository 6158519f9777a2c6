"""Is this launch in the machine's slow state? A probe that every bench and tune launch runs.

NOTE [the slow launch]
    On the 2-vCPU VMs of docs/benchmarks.md some launches run every call several times slower
    for their whole life (two_shot at 2 MiB: about 950 us against 105 us). Measured
    (interleaved launches; docs/benchmarks.md "Slow launches"): it is neither tilecomm's
    buffers nor its runner (ASLR off, 4 KiB aliasing, huge pages, page faults and steal make
    no difference) but a state of the machine, clustered in time and shared by every process:
    *rewriting memory that the other core has just read* becomes about 7x slower (1 MiB:
    444-543 us against 70-74 us), while a copy within one core keeps its speed. A collective
    is exactly that (ranks write the scratch their peers read the call before).

    The probe times it directly: host rank 1 reads 1 MiB of rank 0's heap, then rank 0
    rewrites it, and rank 0 also copies 1 MiB within its own memory; the best of a few tries
    of each. The ratio is about 3 in a normal launch and 19-23 in a slow one; above
    :data:`SLOW_RATIO` the launch is slow. ``tilecomm bench`` marks its rows and says so,
    ``tilecomm tune`` refuses to fit on it, ``tilecomm doctor`` reports it.
"""

from __future__ import annotations

import time

import numpy as np
import torch

#: rewrite of peer-read memory over a local copy above which the launch is slow
SLOW_RATIO = 8.0
PROBE_BYTES = 1 << 20


def probe(comm, nbytes: int = PROBE_BYTES, reps: int = 7) -> dict | None:
    """On every rank (collective over the ranks of this rank's host): rank 0's best times of
    the rewrite and the local copy, in us; None on other ranks and on hosts of one rank."""
    hc = comm.host_comm
    if hc.world_size < 2:
        return None
    buf = hc.alloc((nbytes,), torch.uint8)
    mine = buf.numpy()
    src = np.ones(nbytes, np.uint8)
    out = np.empty_like(src)
    peer = hc.peer(buf, 0).numpy() if hc.rank == 1 else None
    best = [float("inf"), float("inf")]
    for _ in range(reps):
        if hc.rank == 1:
            np.copyto(out, peer)            # the other core reads rank 0's lines
        hc.barrier()
        if hc.rank == 0:
            t0 = time.perf_counter()
            np.copyto(mine, src)            # ... which rank 0 now rewrites
            t1 = time.perf_counter()
            np.copyto(out, src)             # a copy within rank 0's own memory
            t2 = time.perf_counter()
            best = [min(best[0], t1 - t0), min(best[1], t2 - t1)]
        hc.barrier()
    del peer, mine, buf
    hc.barrier()
    if hc.rank != 0:
        return None
    return {"rewrite_us": best[0] * 1e6, "local_us": best[1] * 1e6}


def verdict(per_rank: list) -> dict | None:
    """The launch's state from :func:`probe`'s results (every host's rank 0 counts): the
    worst ratio, and ``slow`` when it is above :data:`SLOW_RATIO`."""
    got = [r for r in per_rank if r]
    if not got:
        return None
    worst = max(got, key=lambda r: r["rewrite_us"] / max(r["local_us"], 1e-3))
    ratio = worst["rewrite_us"] / max(worst["local_us"], 1e-3)
    return {"rewrite_us": worst["rewrite_us"], "local_us": worst["local_us"],
            "ratio": ratio, "slow": ratio > SLOW_RATIO}


def describe(v: dict | None) -> str:
    if v is None:
        return "cross-core write probe: not run (one rank per host)"
    state = ("SLOW: this launch's timings are not representative; rerun later "
             "(NOTE [the slow launch] in bench/machine.py)" if v["slow"] else "normal")
    return (f"cross-core write probe: rewriting 1 MiB a peer core read took "
            f"{v['rewrite_us']:.0f} us, a local copy {v['local_us']:.0f} us "
            f"(x{v['ratio']:.1f}; slow above x{SLOW_RATIO:g}): {state}")

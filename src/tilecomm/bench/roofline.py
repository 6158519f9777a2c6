"""The memory-bandwidth bound of a collective on the shared-memory backend.

On one host every byte a collective moves is a load or store by some core, so the fastest any
implementation of a schedule can be is the time its copies and reductions take at the machine's
copy and add rates, measured in the same run with every rank running at once (they share the
memory bus). The bytes come from the schedule itself, plus the staging copies of buffers that
are not in symmetric memory.
"""

from __future__ import annotations

import time

import numpy as np

from ..algorithms.collectives import COLLECTIVES
from ..algorithms.lower import USER_BUFFERS
from ..algorithms.placement import cpu_plan
from ..backends.cpu.plan import make_layout


def measure_rates(comm, nbytes: int = 64 << 20, reps: int = 5) -> dict:
    """Copy and add rates (bytes of output per second) with all ranks running concurrently.

    Arrays are larger than the last-level cache, so these are DRAM rates: the bound they give
    is meaningful for messages well beyond the cache (smaller ones beat it).
    """
    n = nbytes // 4
    a = np.ones(n, np.float32)
    b = np.ones(n, np.float32)
    c = np.empty(n, np.float32)
    out = {}
    for name, fn in (("copy", lambda: np.copyto(c, a)), ("add", lambda: np.add(a, b, out=c))):
        fn()
        samples = []
        for _ in range(reps):
            comm.barrier()
            t0 = time.perf_counter()
            fn()
            samples.append(time.perf_counter() - t0)
        out[name] = nbytes / min(samples)   # the best run: the bound must not be pessimistic
    return out


def schedule_bytes(collective: str, algo: str, world_size: int, count: int, itemsize: int,
                   staged: bool, root: int = 0) -> list[tuple[int, int]]:
    """``(bytes copied, bytes reduced)`` per rank for one call.

    ``count`` is the element count of the caller's input (as the Communicator passes it);
    ``staged`` says whether user buffers peers read go through scratch (tensors not from
    ``comm.alloc``).
    """
    out = []
    spec = COLLECTIVES[collective]
    for r in range(world_size):
        prog = cpu_plan(collective, algo, world_size, root, r)
        lay = make_layout(prog, world_size, count, _Item(itemsize), None)
        lens = lay.lens[r]
        alias = {b.name: b.like for b in prog.sched.buffers if b.alias and not staged}
        copied = reduced = 0
        for phase in prog.phases:
            for red in phase.ops:
                dst, srcs = red.dst, red.srcs
                nb = lens[dst.buf][dst.chunk] * itemsize
                if red.is_copy:
                    src_rank, src = srcs[0]
                    same = (src_rank == r and src.chunk == dst.chunk and
                            alias.get(src.buf, src.buf) == alias.get(dst.buf, dst.buf))
                    copied += 0 if same else nb
                else:
                    reduced += nb * (len(srcs) - (0 if red.accumulate else 1))
        if staged:
            for b in prog.symmetric:
                if b not in USER_BUFFERS:
                    continue
                nb = sum(lens[b]) * itemsize
                if b in spec.inputs:
                    copied += nb
                if b in ("buf", "out") and not (collective == "reduce" and r != root):
                    copied += nb
        out.append((copied, reduced))
    return out


class _Item:
    """The itemsize-only stand-in for a DType that layout arithmetic needs."""

    def __init__(self, itemsize: int):
        self.itemsize = itemsize


def bound_seconds(collective: str, algo: str, world_size: int, count: int, itemsize: int,
                  staged: bool, rates: dict) -> float:
    """Time of the slowest rank's copies and reductions at the measured rates."""
    per_rank = schedule_bytes(collective, algo, world_size, count, itemsize, staged)
    return max(c / rates["copy"] + a / rates["add"] for c, a in per_rank)


def measure_device_rates(comm, device: str = "cuda", nbytes: int = 256 << 20,
                         reps: int = 5) -> dict:
    """Device copy and add rates (bytes of output per second) with every rank running at once
    (ranks sharing a GPU share its memory bandwidth), timed with CUDA events."""
    import torch

    dev = torch.device(device)
    if dev.type == "cuda" and dev.index is None:
        dev = torch.device("cuda", torch.cuda.current_device())
    n = nbytes // 4
    g = torch.Generator(device=dev).manual_seed(comm.rank)
    a = torch.rand(n, device=dev, generator=g)
    b = torch.rand(n, device=dev, generator=g)
    c = torch.empty_like(a)
    out = {}
    for name, fn in (("copy", lambda: c.copy_(a)), ("add", lambda: torch.add(a, b, out=c))):
        fn()
        torch.cuda.synchronize(dev)
        samples = []
        for _ in range(reps):
            comm.barrier()
            s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            s.record()
            fn()
            e.record()
            e.synchronize()
            samples.append(s.elapsed_time(e) / 1e3)
        out[name] = nbytes / min(samples)
    del a, b, c
    return out

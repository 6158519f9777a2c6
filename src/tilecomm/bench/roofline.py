"""The memory-bandwidth bound of a collective (and of MoE's rows) on one host.

On one host every byte a collective moves is a load or store by some core, so the fastest any
implementation of a schedule can be is the time its copies and reductions take at the machine's
copy and add rates. The bytes come from the schedule itself (:func:`schedule_bytes`), plus the
staging copies of buffers that are not in symmetric memory.

The rates are measured in the same run (:func:`measure_rates`, before the cases and again after
them; the faster of the two counts), at two **levels**: ``cache``, arrays that stay in the
caches (the faster of an L2-sized array and one where all ranks' arrays together fill half the
last-level cache), and ``dram``, arrays far beyond the LLC. At each level every rate is the
fastest this machine showed: the faster of numpy's and torch's copy, the faster of an
out-of-place and an in-place add, the best of several repetitions, the fastest rank.

:func:`bound_time` is the larger of two floors that no schedule can beat at one level's rates:
the slowest rank's bytes at the rates of **one rank alone** (a rank never copies faster than
when it has the memory to itself), and every rank's bytes together at the machine's rate with
**every rank at once** (``W`` times the per-rank rate measured with all ranks copying).

:func:`bound` applies the levels (:func:`bound_level` picks one from a row's working set):

* ``cache`` (every rank's buffers together under :data:`DRAM_FROM` times the LLC): all of the
  schedule's bytes at the cache rates. A working set that small stays cached from one call to
  the next; held to DRAM rates, 2-8 MB all_reduce rows on 2 ranks showed 250-484%.
* ``dram`` (beyond): the larger of the cache floor and the **compulsory** traffic at DRAM
  rates, each rank's user buffers read and written once (:func:`user_traffic`), less the
  share the LLC could still hold from the call before. Only those bytes must cross DRAM: a
  schedule that pipelines its staging copies in chunks keeps the rest in cache, and charging
  every byte at DRAM rates put a 32 MB all_reduce on 2 ranks at 181%.

So a row can reach 100% of its bound but (up to the noise of the measurement) not pass it.
"""

from __future__ import annotations

import time

import numpy as np

from ..algorithms.collectives import COLLECTIVES
from ..algorithms.lower import USER_BUFFERS
from ..algorithms.placement import cpu_plan
from ..backends.cpu.plan import make_layout


#: a working set (every rank's buffers together) at least this many times the last-level cache
#: is held to the DRAM rates; a smaller one to the cache rates
DRAM_FROM = 4
#: what the bound assumes when the cache size cannot be read (a common server LLC)
DEFAULT_LLC = 32 << 20
#: the smaller array of the ``cache`` level: within a core's L2, where a schedule that works
#: in small chunks runs
CACHE_SMALL = 256 << 10


def llc_bytes() -> int:
    """The last-level cache of this machine (the largest level of cpu0's caches in sysfs)."""
    import glob
    best = (0, 0)
    for d in glob.glob("/sys/devices/system/cpu/cpu0/cache/index*"):
        try:
            with open(f"{d}/level") as f:
                level = int(f.read())
            with open(f"{d}/size") as f:
                text = f.read().strip().upper()
        except (OSError, ValueError):
            continue
        mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(text[-1:], 1)
        size = int(text.rstrip("KMG")) * mult if text.rstrip("KMG").isdigit() else 0
        best = max(best, (level, size))
    return best[1] or DEFAULT_LLC


def _best_rate(comm, nbytes: int, fns, reps: int, active: bool) -> float:
    """Bytes of output per second of the fastest of ``fns`` (each makes ``nbytes`` of output),
    best of ``reps`` samples of enough calls to last about a millisecond; every rank meets at
    the barriers, only ``active`` ranks run the calls."""
    calls = max(1, (4 << 20) // nbytes)
    best = 0.0
    for fn in fns:
        if active:
            fn()
        for _ in range(reps):
            comm.barrier()
            if active:
                t0 = time.perf_counter()
                for _ in range(calls):
                    fn()
                best = max(best, nbytes * calls / (time.perf_counter() - t0))
    return best


def measure_rates(comm, dram_bytes: int = 64 << 20, reps: int = 5) -> dict:
    """Copy and add rates (bytes of output per second) at the ``cache`` and ``dram`` levels
    (module doc): ``copy``/``add`` of rank 0 alone, ``copy_all``/``add_all`` per rank with
    every rank at once (0 on ranks other than 0 for the alone rates). Run on every rank."""
    llc = llc_bytes()
    w = comm.world_size
    # cache: three arrays per rank, L2-sized or every rank's together in half the LLC
    cache = [CACHE_SMALL, max(CACHE_SMALL, llc // (6 * w)) // 4 * 4]
    out: dict = {"llc_bytes": llc, "dram": _host_level(comm, dram_bytes, reps)}
    per = [_host_level(comm, n, reps) for n in cache]
    out["cache"] = {k: max(p[k] for p in per) for k in per[0]}
    return out


def _host_level(comm, nbytes: int, reps: int) -> dict:
    """One level's rates of :func:`measure_rates`, with arrays of ``nbytes``."""
    import torch

    n = nbytes // 4
    a, b, c = (np.ones(n, np.float32) for _ in range(3))
    ta, tc = torch.from_numpy(a), torch.from_numpy(c)
    copies = (lambda: np.copyto(c, a), lambda: tc.copy_(ta))
    adds = (lambda: np.add(a, b, out=c), lambda: np.add(c, a, out=c))
    return {"copy": _best_rate(comm, nbytes, copies, reps, comm.rank == 0),
            "add": _best_rate(comm, nbytes, adds, reps, comm.rank == 0),
            "copy_all": _best_rate(comm, nbytes, copies, reps, True),
            "add_all": _best_rate(comm, nbytes, adds, reps, True),
            "bytes": nbytes}


def merge_rates(per_rank: list[dict]) -> dict:
    """Several :func:`measure_rates` as one (every rank's, or one run's before and after its
    cases): the fastest of each kind at each level (the bound must not be made easier to
    meet)."""
    out = {"llc_bytes": per_rank[0]["llc_bytes"]}
    for level in ("cache", "dram"):
        out[level] = {k: max(p[level][k] for p in per_rank) for k in per_rank[0][level]}
    return out


def bound_level(rates: dict, working_set: int) -> str:
    """``cache`` or ``dram``: the rates a row whose buffers (every rank's together) take
    ``working_set`` bytes is held to (module doc)."""
    return "dram" if working_set >= DRAM_FROM * rates["llc_bytes"] else "cache"


def bound_time(per_rank: list[tuple[int, int]], level: dict) -> float:
    """Seconds no schedule can beat that copies ``per_rank[r][0]`` and reduces
    ``per_rank[r][1]`` bytes on rank ``r``, at one level's rates: the slowest rank alone, or
    every rank's bytes at the machine's rate with all ranks at once, whichever is longer."""
    alone = max(c / level["copy"] + a / level["add"] for c, a in per_rank)
    w = len(per_rank)
    together = (sum(c for c, _ in per_rank) / (w * level["copy_all"]) +
                sum(a for _, a in per_rank) / (w * level["add_all"]))
    return max(alone, together)


def bound(per_rank: list[tuple[int, int]], user: list[int], rates: dict,
          working_set: int) -> tuple[float, str]:
    """Seconds no schedule can beat (module doc), and the level they were held to: the
    ``per_rank`` bytes copied and reduced at the cache rates; from the ``dram`` level on (a
    ``working_set`` of every rank's buffers of at least :data:`DRAM_FROM` LLCs) also each
    rank's ``user`` bytes of compulsory traffic (:func:`user_traffic`) at the DRAM copy
    rates, less the share of them the LLC could still hold from the call before."""
    level = bound_level(rates, working_set)
    t = bound_time(per_rank, rates["cache"])
    if level == "dram":
        # a copy of n bytes reads n and writes n: traffic u is u/2 bytes of copy
        uncached = 1 - rates["llc_bytes"] / working_set
        t = max(t, bound_time([(u * uncached / 2, 0) for u in user], rates["dram"]))
    return t, level


def user_traffic(collective: str, world_size: int, count: int, itemsize: int,
                 root: int = 0) -> list[int]:
    """Bytes of each rank's own buffers that any schedule reads or writes at least once: its
    input read, its output written (``count`` as in :func:`schedule_bytes`). broadcast's root
    only reads, the other ranks only write; reduce's non-roots only read."""
    n = count * itemsize
    w = world_size
    per = {"all_reduce": lambda r: 2 * n, "all_to_all": lambda r: 2 * n,
           "all_gather": lambda r: n + n * w, "reduce_scatter": lambda r: n + n // w,
           "broadcast": lambda r: n, "reduce": lambda r: 2 * n if r == root else n}
    if collective not in per:
        raise KeyError(f"no user traffic for {collective!r}")
    return [per[collective](r) for r in range(w)]


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
                  staged: bool, rates: dict, working_set: int) -> tuple[float, str]:
    """:func:`bound` of one call: its schedule's bytes and its user traffic."""
    return bound(schedule_bytes(collective, algo, world_size, count, itemsize, staged),
                 user_traffic(collective, world_size, count, itemsize), rates, working_set)


def _device_rate(comm, dev, nbytes: int, fns, reps: int, active: bool) -> float:
    """:func:`_best_rate` on a CUDA device: each sample enough back-to-back kernels to
    outlast their launches, timed with CUDA events."""
    import torch

    calls = max(1, (64 << 20) // nbytes)
    best = 0.0
    for fn in fns:
        if active:
            fn()
            torch.cuda.synchronize(dev)
        for _ in range(reps):
            comm.barrier()
            if active:
                s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                s.record()
                for _ in range(calls):
                    fn()
                e.record()
                e.synchronize()
                best = max(best, nbytes * calls / (s.elapsed_time(e) / 1e3))
    return best


def measure_device_rates(comm, device: str = "cuda", dram_bytes: int = 256 << 20,
                         reps: int = 5) -> dict:
    """:func:`measure_rates` on a CUDA device: ``cache`` (arrays every rank's together keep
    in half the L2) and ``dram`` (HBM) levels, one rank alone and every rank at once (ranks
    sharing a GPU share its memory bandwidth)."""
    import torch

    dev = torch.device(device)
    if dev.type == "cuda" and dev.index is None:
        dev = torch.device("cuda", torch.cuda.current_device())
    l2 = getattr(torch.cuda.get_device_properties(dev), "L2_cache_size", 0) or DEFAULT_LLC
    w = comm.world_size
    out: dict = {"llc_bytes": l2}
    for level, nbytes in {"cache": max(64 << 10, l2 // (6 * w)) // 4 * 4,
                          "dram": dram_bytes}.items():
        n = nbytes // 4
        g = torch.Generator(device=dev).manual_seed(comm.rank)
        a = torch.rand(n, device=dev, generator=g)
        b = torch.rand(n, device=dev, generator=g)
        c = torch.empty_like(a)
        copies = (lambda: c.copy_(a),)
        adds = (lambda: torch.add(a, b, out=c), lambda: c.add_(a))
        out[level] = {
            "copy": _device_rate(comm, dev, nbytes, copies, reps, comm.rank == 0),
            "add": _device_rate(comm, dev, nbytes, adds, reps, comm.rank == 0),
            "copy_all": _device_rate(comm, dev, nbytes, copies, reps, True),
            "add_all": _device_rate(comm, dev, nbytes, adds, reps, True),
            "bytes": nbytes}
    return out

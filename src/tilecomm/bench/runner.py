"""The benchmark harness: sizes x algorithms on a live rank group, with baselines and checks.

Per size and algorithm every rank runs ``warmup`` calls, then ``rounds`` timed rounds of
``iters`` back-to-back calls (each round starts after a barrier). A round's time is the slowest
rank's mean time per call, as nccl-tests reports; the row gives the median round. Baselines run
the same operation through torch.distributed in the same processes, interleaved per size.
"""

from __future__ import annotations

import socket
import statistics
import time
from dataclasses import dataclass, field

import torch

from .. import tuner
from ..algorithms.registry import algorithms
from ..launch import RankGroup
from ..types import DTYPE_BY_NAME
from .cases import CASES, Buffers, exact_data, round_count
from .roofline import bound_seconds, measure_rates


@dataclass
class BenchConfig:
    op: str
    world_size: int = 2
    sizes: list[int] = field(default_factory=lambda: [8])
    dtype: str = "float32"
    algos: list[str] = field(default_factory=lambda: ["auto"])
    mem: str = "user"               # user: ordinary tensors (staged); heap: comm.alloc tensors
    iters: int | None = None        # None: chosen per size
    warmup: int | None = None
    rounds: int = 5
    check: bool = False
    vs: list[str] = field(default_factory=list)   # baselines: "gloo"
    bound: bool = True              # measure copy/add rates and report the memory bound
    timeout: float = 120.0


def auto_iters(nbytes: int) -> int:
    return max(3, min(500, (32 << 20) // max(nbytes, 1)))


# ---- rank side ------------------------------------------------------------------------------
def _rank_init_gloo(comm, port: int) -> bool:
    import warnings

    import torch.distributed as dist
    # The baseline calls all_gather_into_tensor, which torch marks deprecated; once per rank
    # per size that warning would drown the table.
    warnings.filterwarnings("ignore", category=FutureWarning)
    if not dist.is_initialized():
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}",
                                rank=comm.rank, world_size=comm.world_size)
    return True


def _time_rounds(comm_barrier, fn, warmup: int, iters: int, rounds: int) -> list[float]:
    for _ in range(warmup):
        fn()
    out = []
    for _ in range(rounds):
        comm_barrier()
        t0 = time.perf_counter()
        for _ in range(iters):
            fn()
        out.append((time.perf_counter() - t0) / iters)
    return out


def _check(comm, case, bufs, algo, d, in_n) -> int:
    """Run once on exact data and count the elements that differ from the definition."""
    r, w = comm.rank, comm.world_size
    bufs.inp.copy_(exact_data(1, r, in_n, d.torch))
    case.run(comm, bufs, algo)
    inputs = [exact_data(1, j, in_n, d.torch) for j in range(w)]
    want = case.expected(inputs, r, w).reshape(-1)
    got = (bufs.out if bufs.out is not None else bufs.inp).reshape(-1)
    return int((got != want).sum()) if got.shape == want.shape else int(want.numel())


def _rank_bench(comm, cfg: BenchConfig, nbytes: int, algo: str) -> dict:
    case = CASES[cfg.op]
    w = comm.world_size
    d = DTYPE_BY_NAME[cfg.dtype]
    n = round_count(cfg.op, nbytes, d.itemsize, w)
    in_n = case.in_count(n, w)
    out_n = case.out_count(n, w) if case.out_count else None
    make = (lambda k: comm.alloc(k, d.torch)) if cfg.mem == "heap" else \
        (lambda k: torch.zeros(k, dtype=d.torch))
    bufs = Buffers(make(in_n), make(out_n) if out_n is not None else None)
    wrong = _check(comm, case, bufs, algo, d, in_n) if cfg.check else None
    bufs.inp.fill_(1)
    iters = cfg.iters or auto_iters(nbytes)
    warmup = cfg.warmup if cfg.warmup is not None else max(1, iters // 5)
    res = {"times": _time_rounds(comm.barrier, lambda: case.run(comm, bufs, algo),
                                 warmup, iters, cfg.rounds),
           "wrong": wrong, "count": n, "iters": iters}
    if cfg.check:   # once more after timing: the warm path (cached plans, memo) must be right too
        res["wrong"] += _check(comm, case, bufs, algo, d, in_n)
    if "gloo" in cfg.vs:
        import torch.distributed as dist
        gb = Buffers(torch.ones(in_n, dtype=d.torch),
                     torch.zeros(out_n, dtype=d.torch) if out_n is not None else None)
        try:
            res["gloo"] = _time_rounds(dist.barrier, lambda: case.baseline(dist, gb),
                                       warmup, iters, cfg.rounds)
        except (RuntimeError, NotImplementedError, ValueError) as e:
            res["gloo_error"] = str(e).splitlines()[0][:80]
    return res


# ---- launcher side --------------------------------------------------------------------------
def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _slowest_median(per_rank: list[list[float]]) -> float:
    rounds = len(per_rank[0])
    return statistics.median(max(rk[i] for rk in per_rank) for i in range(rounds))


def heap_bytes_for(cfg: BenchConfig) -> int:
    biggest = max(cfg.sizes)
    return 2 * biggest + (8 << 20)


def resolve_algos(cfg: BenchConfig) -> list[str]:
    if cfg.op == "send_recv":
        return ["p2p"]
    if cfg.algos == ["all"]:
        return algorithms(cfg.op)
    return cfg.algos


def run(cfg: BenchConfig, progress=None) -> list[dict]:
    """Run the benchmark; one row per (size, algorithm). ``progress(done, total, label)``."""
    if cfg.op not in CASES:
        raise ValueError(f"unknown operation {cfg.op!r}; choose one of {', '.join(CASES)}")
    if cfg.dtype not in DTYPE_BY_NAME:
        raise ValueError(f"unknown dtype {cfg.dtype!r}; choose one of {', '.join(DTYPE_BY_NAME)}")
    if CASES[cfg.op].reduces and not DTYPE_BY_NAME[cfg.dtype].reducible:
        raise ValueError(f"{cfg.op} reduces, and {cfg.dtype} supports data movement only; "
                         f"pick a float or int32/int64 dtype")
    algos = resolve_algos(cfg)
    for a in algos:
        if a not in ("auto", "p2p") and a not in algorithms(cfg.op):
            raise ValueError(f"{cfg.op}: unknown algorithm {a!r}; choose from "
                             f"{', '.join(algorithms(cfg.op))}, auto or all")
    heap = heap_bytes_for(cfg) if cfg.mem == "heap" else (8 << 20)
    rows = []
    itemsize = DTYPE_BY_NAME[cfg.dtype].itemsize
    with RankGroup(cfg.world_size, timeout=cfg.timeout, heap_bytes=heap) as group:
        if "gloo" in cfg.vs:
            group.run(_rank_init_gloo, _free_port())
        rates = None
        if cfg.bound and cfg.op not in ("send_recv", "all_to_all_v"):
            per = group.run(measure_rates)
            # the fastest rank's rates: the bound must not be made easier to meet
            rates = {k: max(p[k] for p in per) for k in ("copy", "add")}
        total, done = len(cfg.sizes) * len(algos), 0
        for nbytes in cfg.sizes:
            for algo in algos:
                if progress:
                    progress(done, total, f"{cfg.op} {nbytes} B {algo}")
                res = group.run(_rank_bench, cfg, nbytes, algo)
                rows.append(_row(cfg, nbytes, algo, res, rates, itemsize))
                done += 1
        if progress:
            progress(done, total, "done")
    return rows


def _row(cfg, nbytes, algo, res, rates, itemsize) -> dict:
    w = cfg.world_size
    case = CASES[cfg.op]
    count = res[0]["count"]
    size = count * itemsize
    used = algo if algo != "auto" else (tuner.choose(cfg.op, size, w) if cfg.op != "send_recv"
                                        else "p2p")
    t = _slowest_median([r["times"] for r in res])
    algbw = size / t / 1e9
    row = {"collective": cfg.op, "algo": used, "requested": algo, "world_size": w,
           "bytes": size, "count": count, "dtype": cfg.dtype, "mem": cfg.mem,
           "time_us": t * 1e6, "algbw_gbs": algbw, "busbw_gbs": algbw * case.factor(w),
           "iters": res[0]["iters"], "rounds": cfg.rounds}
    if cfg.check:
        row["wrong"] = sum(r["wrong"] for r in res)
    if "gloo" in cfg.vs:
        if "gloo" in res[0]:
            gt = _slowest_median([r["gloo"] for r in res])
            row.update(gloo_time_us=gt * 1e6, gloo_busbw_gbs=size / gt / 1e9 * case.factor(w),
                       vs_gloo=gt / t)
        else:
            row["gloo_error"] = res[0].get("gloo_error", "unsupported")
    if rates is not None and cfg.op not in ("send_recv", "all_to_all_v"):
        in_count = case.in_count(count, w)
        b = bound_seconds(cfg.op, used, w, in_count, itemsize, cfg.mem != "heap", rates)
        # memcpy: one copy of the caller's largest buffer, the floor of any staged collective
        row.update(bound_us=b * 1e6, frac_of_bound=b / t, copy_gbs=rates["copy"] / 1e9,
                   add_gbs=rates["add"] / 1e9, memcpy_us=size / rates["copy"] * 1e6)
    return row

"""Phase ``timing``: how fast every collective is, against baselines of the same run.

1. **the device copy rate** (every rank copying at once): the bound of every row;
2. **per kernel** (float32 sum, the table's sizes, ordinary and heap tensors): the bench's
   timed rounds (``runner.time_case``) of every fused kernel;
3. **the sweep**: every collective with ``algo="auto"`` on heap tensors (zero copy, what a
   CUDA graph can capture) from 8 B to 256 MB, **eager** (every row, sizes ascending) **then
   under CUDA-graph replay**, beside
   NCCL (same ranks, same GPU) and, for all_reduce, PyTorch's SymmetricMemory one-shot and
   two-shot (:mod:`.baselines`).

Times: per round ``iters`` back-to-back calls between CUDA events (a graph replays ``k``
captured calls; time per call = replay / k), the slowest rank's median round. In-place sums
grow by the world size per call, so the data is re-filled (untimed) before it could overflow
(``runner.safe_chunk``), identically for every method. ``bound_us``: the bytes all ranks must
move through the one HBM (each rank's output that comes from peers, times the ranks on the
GPU) over the measured copy rate; between GPUs, over NVLink or the peer copy rate.
"""

from __future__ import annotations

import gc
import time

import torch

from ...algorithms.collectives import BUSBW_FACTOR
from ..cases import CASES, BenchCase
from ..runner import safe_chunk
from . import kernels as K
from .baselines import copy_rate


def moved_bytes(op: str, w: int, nbytes: int) -> float:
    """Bytes one rank must at least write (its output that comes from peers)."""
    if op == "all_reduce":
        return 2 * (w - 1) / w * nbytes
    if op in ("all_to_all", "all_to_all_v", "reduce_scatter", "all_gather"):
        return (w - 1) / w * nbytes           # all_gather: nbytes is the output
    return nbytes                             # broadcast, reduce


def bound_us(op: str, w: int, nbytes: int, bounds: dict) -> tuple[str | None, float | None]:
    """``(kind, microseconds)`` of the memory bound of a row (NOTE in the module doc)."""
    moved = moved_bytes(op, w, nbytes)
    gpus = bounds.get("gpus", 1)
    if gpus > 1 and bounds.get("nvlink_GBps"):
        return "nvlink", moved / bounds["nvlink_GBps"] / 1e3
    if gpus > 1 and bounds.get("peer_copy_GBps"):
        return "peer copy", moved / bounds["peer_copy_GBps"] / 1e3
    if bounds.get("copy_GBps"):
        return "device copy", (w // gpus) * moved / bounds["copy_GBps"] / 1e3
    return None, None


def timed(rk, fn, *, graph: bool, refill=None, chunk: int | None = None,
          iters: int | None = None) -> list[float]:
    """Seconds per call of each round on this rank: eager back-to-back calls, or replays of a
    CUDA graph of ``k`` captured calls (``k`` = ``iters``, at most ``chunk``)."""
    cfg, runner = rk.cfg, rk.runner
    iters = iters or cfg["iters"]
    clock = runner.Clock(rk.dev)
    if not graph:
        return runner.time_rounds(rk.comm.barrier, fn, cfg["warmup"], iters, cfg["rounds"],
                                  refill=refill, chunk=chunk, clock=clock)
    k = max(1, min(iters, chunk or iters))
    side = torch.cuda.Stream(rk.dev)
    side.wait_stream(torch.cuda.current_stream(rk.dev))
    with torch.cuda.stream(side):          # warm outside the capture: scratch grows here
        if refill:
            refill()
        fn()
    torch.cuda.current_stream(rk.dev).wait_stream(side)
    rk.sync()
    rk.comm.barrier()
    g = torch.cuda.CUDAGraph()
    # thread_local: another thread's CUDA call during the capture (NCCL's watchdog polling
    # the warm-up's event) must not invalidate it
    with torch.cuda.graph(g, capture_error_mode="thread_local"):
        for _ in range(k):
            fn()
    reps = max(1, iters // k)
    secs = runner.time_rounds(rk.comm.barrier, g.replay, 1, reps, cfg["rounds"],
                              refill=refill, chunk=1 if refill else None, clock=clock)
    del g
    return [s / k for s in secs]


def measure(rk, label: str, fn, row: dict, **kw) -> None:
    """Time ``fn`` (or record why not: ``fn`` a string) into ``row["us"][label]`` on every
    rank; a failure is the failing rank's error in ``row["errors"][label]``."""
    if isinstance(fn, str):
        row["errors"][label] = fn
        return
    rk.timed_into(row, label, lambda: timed(rk, fn, **kw), rk.cfg["rounds"])


def agreed(rk, fn):
    """``fn`` where every rank has a callable, else every rank's reason (collective)."""
    if rk.all_ok(not isinstance(fn, str)):
        return fn
    return fn if isinstance(fn, str) and fn.startswith("n/a") else \
        rk.failed_elsewhere(fn if isinstance(fn, str) else None)


def _fill_for(case: BenchCase, t: torch.Tensor):
    """``(refill, chunk)`` keeping an in-place sum of ones in ``t`` finite (both None when the
    data does not grow)."""
    chunk = safe_chunk(case.op, getattr(torch, case.dtype), case.world, case.redop)
    t.fill_(1)
    return ((lambda: t.fill_(1)) if chunk else None), chunk


def kernel_rows(rk, deadline: float, bounds: dict) -> list[dict]:
    """Part 2: every fused kernel at the table's sizes, both memory kinds (eager)."""
    fused, _ = K.registered(rk.cfg)
    out = []
    for case in K.timing_table(rk.cfg, rk.w, fused):
        rec = dict(K.record(rk.runner, case, "timing"), part="kernel", us={}, errors={})
        if not rk.in_time(deadline):
            rec["errors"]["tilecomm"] = "skipped: phase budget spent"
            out.append(rec)
            continue
        bufs = None
        try:
            bufs = rk.runner.make_buffers(rk.comm, case, rk.dev)
            bufs.root, bufs.split_seed = 0, 0
            refill, chunk = _fill_for(case, bufs.inp)
            fn = (lambda b=bufs, c=case: CASES[c.op].run(rk.comm, b, c.algo))
        except Exception as e:  # noqa: BLE001
            fn = f"{type(e).__name__}: {str(e)[:300]}"
            refill = chunk = None
        fn = agreed(rk, fn)
        measure(rk, "tilecomm", fn, rec, graph=False, refill=refill, chunk=chunk)
        _finish(rk, rec, case, bounds)
        bufs = None
        gc.collect()
        out.append(rec)
        rk.log(rec)
    return out


def arena_buffers(arena, case: BenchCase, runner):
    """``case``'s buffers as views at the start of the two heap arenas (input, output): the
    same offsets on every rank (zero copy), and no heap growth per row (the device heap
    returns nothing until the communicator closes)."""
    from ..cases import Buffers
    _, in_n, out_n = runner.case_counts(case)
    dt = getattr(torch, case.dtype)
    item = torch.empty((), dtype=dt).element_size()
    inp = arena[0][:in_n * item].view(dt)
    out = arena[1][:out_n * item].view(dt) if out_n is not None else None
    return Buffers(inp, out, redop=case.redop)


def _arena(rk, cases):
    """Two uint8 heap tensors as large as the largest input and output of ``cases``."""
    need_in = need_out = 1
    for c in cases:
        _, i, o = rk.runner.case_counts(c)
        item = torch.empty((), dtype=getattr(torch, c.dtype)).element_size()
        need_in, need_out = max(need_in, i * item), max(need_out, (o or 0) * item)
    return (rk.runner.heap_alloc(rk.comm, need_in, torch.uint8, rk.dev),
            rk.runner.heap_alloc(rk.comm, need_out, torch.uint8, rk.dev))


def sweep_rows(rk, deadline: float, bounds: dict) -> list[dict]:
    """Part 3: every collective, auto, heap tensors, 8 B..256 MB, eager and graph, beside
    NCCL and (all_reduce) SymmetricMemory."""
    base = rk.baselines()
    out = []
    cases = [BenchCase(op, "auto", "float32", n, "heap", "sum", rk.w)
             for op in rk.cfg["sweep_ops"] for n in rk.cfg["sweep_sizes"]]
    arena = _arena(rk, cases)
    most = max(rk.runner.case_counts(c)[0] for c in cases if c.op == "all_reduce") \
        if "all_reduce" in rk.cfg["sweep_ops"] else None
    # every eager row before any graph row: once a graph captured this communicator's
    # kernels their scratch cannot grow (it would free memory the graph uses), and the eager
    # rows, sizes ascending, grow it to the largest the graph rows need
    for mode in ["eager"] + (["graph"] if rk.cuda else []):
        for case in cases:
            op = case.op
            rec = dict(K.record(rk.runner, case, "timing"), part="sweep", mode=mode,
                       case=f"{case.id}/{mode}", us={}, errors={})
            if not rk.in_time(deadline):
                rec["errors"]["tilecomm"] = "skipped: phase budget spent"
                out.append(rec)
                continue
            graph = mode == "graph"
            bufs = arena_buffers(arena, case, rk.runner)
            refill, chunk = _fill_for(case, bufs.inp)
            measure(rk, "tilecomm", lambda b=bufs, op=op: CASES[op].run(rk.comm, b, "auto"),
                    rec, graph=graph, refill=refill, chunk=chunk)
            bufs = None
            fn = agreed(rk, base.nccl_call(case))
            if not isinstance(fn, str):
                refill, chunk = _fill_for(case, fn.bufs.inp)
            measure(rk, "nccl", fn, rec, graph=graph, refill=refill, chunk=chunk)
            fn = None
            if op == "all_reduce":
                count = rk.runner.case_counts(case)[0]
                for algo in ("one_shot", "two_shot"):
                    fn = base.symm_call(algo, count, torch.float32, most)
                    if not isinstance(fn, str):
                        refill, chunk = _fill_for(case, fn.bufs)
                    measure(rk, f"torch symm_mem {algo}", fn, rec, graph=graph,
                            refill=refill, chunk=chunk)
                    fn = None
            _finish(rk, rec, case, bounds)
            gc.collect()
            out.append(rec)
            rk.log(rec)
    return out


def _finish(rk, rec: dict, case: BenchCase, bounds: dict) -> None:
    """Bandwidths, the bound and the ratios of a timed row."""
    t = rec["us"].get("tilecomm")
    kind, b = bound_us(case.op, rk.w, case.nbytes, bounds)
    rec.update(bound=kind, bound_us=b)
    if t:
        algbw = case.nbytes / t / 1e3
        rec.update(algbw_GBps=algbw, busbw_GBps=algbw * BUSBW_FACTOR[case.op](rk.w))
        if b:
            rec["frac_of_bound"] = b / t
        # every ratio reads the same way: > 1 means tilecomm is faster
        rec["speedup"] = {lab: v / t for lab, v in rec["us"].items() if lab != "tilecomm"}


def run(rk, deadline: float) -> list[dict]:
    t0 = time.time()
    cfg = rk.cfg
    rate = copy_rate(rk, cfg["copy_bytes"])
    bounds = dict(cfg.get("bounds") or {}, copy_GBps=(rate or {}).get("GBps"))
    out = [dict(phase="timing", case=f"device-copy/w{rk.w}", part="copy", world=rk.w,
                copy=rate, bounds=bounds)]
    span = deadline - t0
    out += kernel_rows(rk, t0 + 0.3 * span, bounds)
    out += sweep_rows(rk, deadline, bounds)
    return out

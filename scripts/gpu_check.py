#!/usr/bin/env python
"""Check and time every registered GPU kernel in one command (a lent H200: < 5 minutes).

    python scripts/gpu_check.py                 # GPU: 2, 4 and 8 processes sharing the GPU
    python scripts/gpu_check.py --interpret     # CPU dry run (TRITON_INTERPRET=1, 2 ranks)

What it does, per world size (one process per rank, all on ``cuda:0`` over the CUDA IPC heap;
with ``--interpret`` CPU ranks on the shared-memory heap):

1. **correctness** of every kernel in ``tilecomm.backends.triton.registry`` (all families),
   several sizes (odd ones too) and dtypes: fresh random integers per call (exact in every
   dtype), outputs poisoned first, every case called twice in a row, compared exactly with a
   torch reference computed from every rank's inputs. A failing case is recorded (with the
   error) and the ranks re-align their epochs; the script goes on.
2. **timing** (fp32): per kernel and size, a loop of back-to-back launches between CUDA events
   (``--interpret``: perf_counter), median of repeats, the slowest rank's; against the GPU's
   own device-to-device copy bandwidth measured in the same run (the time to copy the bytes
   a rank must move) and a one-process torch reference doing the same data movement or
   reduction over all ranks' data (e.g. ``torch.stack(parts).sum(0)``).
3. **latency**: 8 KB all_reduce among the largest world, end to end (``backend.run``: host
   handshake, kernel, error check) vs a same-size copy launch + host barrier.

Writes ``$OUT/gpu_check.json`` and ``$OUT/gpu_check.txt`` (``$OUT`` defaults to
``./gpu_check_out``) and prints the table last. Never changes GPU settings (clocks are only
read, through nvidia-smi). Per-world watchdogs stop rank processes that outlive the budget.

Exit status: 0 every case ran and passed; 1 a kernel failed (or a world did not finish);
2 nothing failed but some cases were skipped because the time budget ran out.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import traceback

BUSBW = {"all_reduce": lambda w: 2 * (w - 1) / w, "all_gather": lambda w: (w - 1) / w,
         "reduce_scatter": lambda w: (w - 1) / w, "all_to_all": lambda w: (w - 1) / w,
         "all_to_all_v": lambda w: (w - 1) / w, "broadcast": lambda w: 1.0,
         "reduce": lambda w: 1.0}


def _config(interpret: bool, worlds: list[int] | None) -> dict:
    if interpret:
        return dict(interpret=True, worlds=worlds or [2], device="cpu",
                    check_counts=[1, 37, 300], check_dtypes=["float32", "bfloat16"],
                    time_bytes=[256, 4096], iters=2, repeats=3, device_timeout=5.0,
                    latency_iters=5, copy_bytes=8 << 20, heap_bytes=16 << 20)
    return dict(interpret=False, worlds=worlds or [2, 4, 8], device="cuda",
                check_counts=[1, 1003, 65536 + 5, 262144],
                check_dtypes=["float32", "bfloat16", "float16", "int32"],
                time_bytes=[8 << 10, 1 << 20, 16 << 20], iters=20, repeats=5,
                device_timeout=5.0, latency_iters=200, copy_bytes=256 << 20,
                heap_bytes=1 << 30)


# =============================================================================================
# rank side

class _Rank:
    def __init__(self, comm, cfg, partial_path):
        import torch

        self.torch = torch
        self.comm, self.cfg = comm, cfg
        self.w, self.r = comm.world_size, comm.rank
        self.partial = partial_path if comm.rank == 0 else None
        from tilecomm.backends.triton import TritonBackend, registry

        dev = cfg["device"]
        if dev == "cuda":
            torch.cuda.set_device(0)
            dev = "cuda:0"
        self.backend = TritonBackend(comm, dev, nbytes=cfg["heap_bytes"],
                                     timeout=cfg["device_timeout"])
        self.ctx = self.backend.ctx
        self.device = self.backend.device
        self.registry = registry
        self.kernels = sorted(registry.load())
        if cfg.get("kernels"):
            self.kernels = [k for k in self.kernels if f"{k[0]}/{k[1]}" in cfg["kernels"]]
        if cfg.get("break") and comm.rank == 0:
            # --break KERNEL: rank 0 runs KERNEL, then corrupts one element of its output:
            # shows that a failing kernel is reported, and that the others still run
            import dataclasses

            key = tuple(cfg["break"].split("/"))
            spec = registry.KERNELS[key]
            registry.KERNELS[key] = dataclasses.replace(spec, launch=_broken(spec.launch))

    # ---- agreement among ranks (host communicator) --------------------------------------------
    def gather(self, ints):
        return self.ctx.host_all_gather(ints)

    def agree(self, flag: bool) -> bool:
        """Rank 0's decision, on every rank."""
        return bool(self.gather([int(flag)])[0][0])

    def sync(self):
        if self.device.type == "cuda":
            self.torch.cuda.synchronize(self.device)

    def realign(self):
        """After a failure: every rank finishes its kernels, then all take the largest epoch
        (signals only grow, so stale ones stay below every later epoch)."""
        self.sync()
        self.backend.heap.errors.zero_()
        top = max(e[0] for e in self.gather([self.backend.heap._epoch]))
        self.backend.heap._epoch = top + 2
        self.backend.heap.barrier()

    def log(self, rec):
        if self.partial:
            with open(self.partial, "a") as f:
                f.write(json.dumps(rec) + "\n")

    # ---- data ------------------------------------------------------------------------------
    def rand(self, seed, rank, n, dtype):
        g = self.torch.Generator().manual_seed(seed * 1009 + rank)
        return self.torch.randint(-8, 9, (n,), generator=g).to(dtype)

    def build(self, coll, algo, dtype, count, seed, root):
        """(CollectiveCall, list of (buffer, expected)) for this rank; inputs of every rank
        come from seeds every rank knows, so each rank computes the reference itself."""
        torch = self.torch
        from tilecomm.backends.base import CollectiveCall
        from tilecomm.types import lookup_dtype

        w, r, dev = self.w, self.r, self.device
        d = lookup_dtype(dtype)
        poison = 111
        ins = [self.rand(seed, q, count, dtype) for q in range(w)]
        total = torch.stack([t.double() for t in ins]).sum(0).to(dtype)
        mine = ins[r].to(dev)
        if coll == "all_reduce":
            return (CollectiveCall(coll, algo, d, count, {"buf": mine}, op=_sum()),
                    [(mine, total)])
        if coll == "reduce":
            want = total if r == root else ins[r]
            return (CollectiveCall(coll, algo, d, count, {"buf": mine}, op=_sum(), root=root),
                    [(mine, want)])
        if coll == "broadcast":
            buf = mine if r == root else torch.full((count,), poison, dtype=dtype, device=dev)
            return (CollectiveCall(coll, algo, d, count, {"buf": buf}, root=root),
                    [(buf, ins[root])])
        if coll == "all_gather":
            out = torch.full((w * count,), poison, dtype=dtype, device=dev)
            return (CollectiveCall(coll, algo, d, count, {"in": mine, "out": out}),
                    [(out, torch.cat(ins))])
        if coll == "reduce_scatter":
            m = count // w
            out = torch.full((m,), poison, dtype=dtype, device=dev)
            return (CollectiveCall(coll, algo, d, count, {"in": mine, "out": out}, op=_sum()),
                    [(out, total[r * m:(r + 1) * m])])
        if coll == "all_to_all":
            m = count // w
            out = torch.full((count,), poison, dtype=dtype, device=dev)
            want = torch.cat([ins[q][r * m:(r + 1) * m] for q in range(w)])
            return (CollectiveCall(coll, algo, d, count, {"in": mine, "out": out}),
                    [(out, want)])
        if coll == "all_to_all_v":
            # count = elements per row; rows per (src, dst) from a seeded matrix, zeros too
            g = torch.Generator().manual_seed(seed)
            rows = torch.randint(0, 5, (w, w), generator=g)
            rows[torch.rand((w, w), generator=g) < 0.25] = 0
            rows = rows.tolist()
            row = count
            data = [self.rand(seed, q, sum(rows[q]) * row, dtype) for q in range(w)]

            def chunk(q, j):
                s = sum(rows[q][:j]) * row
                return data[q][s:s + rows[q][j] * row]

            want = torch.cat([chunk(q, r) for q in range(w)])
            holder = []

            def make_out(n_rows):
                holder.append(torch.full((n_rows * row,), poison, dtype=dtype, device=dev))
                return holder[-1]

            call = CollectiveCall(coll, algo, d, row, {"in": data[r].to(dev)},
                                  send_rows=rows[r], recv_rows=None, make_out=make_out)
            return call, [(holder, want)]
        raise NotImplementedError(f"gpu_check has no reference for {coll}")

    # ---- 1. correctness ----------------------------------------------------------------------
    def check_all(self, deadline):
        torch = self.torch
        out = []
        seed = 1
        for coll, algo in self.kernels:
            spec = self.registry.KERNELS[(coll, algo)]
            dtypes = [getattr(torch, n) for n in self.cfg["check_dtypes"]
                      if getattr(torch, n) in spec.dtypes]
            for dt in dtypes:
                for count in self.cfg["check_counts"]:
                    if coll in ("all_to_all", "reduce_scatter"):
                        count = max(1, -(-count // self.w)) * self.w
                    if coll == "all_to_all_v":
                        count = max(1, count // 64)          # elements per row
                    if not self.agree(time.time() < deadline):
                        out.append(dict(kernel=f"{coll}/{algo}", world=self.w,
                                        dtype=str(dt)[6:], count=count, ok=None,
                                        error="skipped: world budget spent"))
                        continue
                    seed += 1
                    rec = self.check_case(coll, algo, dt, count, seed)
                    out.append(rec)
                    self.log(dict(phase="check", **rec))
        return out

    def check_case(self, coll, algo, dt, count, seed):
        """Two consecutive calls, fresh data each. Every rank makes both calls unless a call
        raised somewhere (then all stop after it and re-align); wrong data is only recorded."""
        err = None
        t0 = time.perf_counter()
        oks = [1] * self.w
        for k in range(2):
            root = (seed + k) % self.w
            raised = False
            try:
                call, expect = self.build(coll, algo, dt, count, seed * 2 + k, root)
                self.backend.run(call)
                self.sync()
            except Exception as e:  # noqa: BLE001 - reported, not fatal
                raised = True
                err = err or f"call {k}: {type(e).__name__}: {str(e)[:400]}"
            if not raised:
                try:
                    self.compare(expect, k, root)
                except AssertionError as e:
                    err = err or str(e)[:400]
            status = self.gather([int(err is None), int(raised)])
            oks = [a and s[0] for a, s in zip(oks, status)]
            if any(s[1] for s in status):
                break
        if not all(oks):
            self.realign()
        return dict(kernel=f"{coll}/{algo}", world=self.w, dtype=str(dt)[6:], count=count,
                    ok=all(oks), ranks_failed=[q for q, o in enumerate(oks) if not o],
                    error=err, seconds=round(time.perf_counter() - t0, 3))

    def compare(self, expect, k, root):
        torch = self.torch
        for buf, want in expect:
            if isinstance(buf, list):     # make_out's tensor
                if len(buf) != 1:
                    raise AssertionError(f"call {k}: make_out called {len(buf)} times")
                buf = buf[0]
            got = buf.cpu()
            if got.shape != want.shape:
                raise AssertionError(f"call {k}: shape {tuple(got.shape)} != "
                                     f"{tuple(want.shape)}")
            if not torch.equal(got, want):
                bad = (got != want).nonzero().flatten()
                i = int(bad[0])
                raise AssertionError(f"call {k} (root {root}): {len(bad)}/{got.numel()} "
                                     f"wrong, first at {i}: {got[i].item()} != "
                                     f"{want[i].item()}")

    # ---- 2. timing --------------------------------------------------------------------------
    def timer(self):
        torch = self.torch
        if self.device.type == "cuda":
            def measure(fn, n):
                s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                s.record()
                for _ in range(n):
                    fn()
                e.record()
                e.synchronize()
                return s.elapsed_time(e) * 1e3 / n      # us per call
        else:
            def measure(fn, n):
                t = time.perf_counter()
                for _ in range(n):
                    fn()
                return (time.perf_counter() - t) * 1e6 / n
        return measure

    def copy_bandwidth(self):
        """GB/s of one device-to-device copy (bytes copied / time), rank 0 alone."""
        torch = self.torch
        res = None
        if self.r == 0:
            n = self.cfg["copy_bytes"] // 4
            a = torch.randn(n, device=self.device)
            b = torch.empty_like(a)
            measure = self.timer()
            b.copy_(a)
            us = statistics.median(measure(lambda: b.copy_(a), 5) for _ in range(5))
            res = dict(bytes=n * 4, us=us, GBps=n * 4 / us / 1e3,
                       read_plus_write_GBps=2 * n * 4 / us / 1e3)
            del a, b
        self.backend.heap.barrier()
        return res

    def torch_reference(self, coll, count, dtype):
        """(op description, us) of one process doing the whole world's movement/reduction."""
        torch = self.torch
        w, dev = self.w, self.device
        measure = self.timer()
        parts = [torch.randn(count, device=dev).to(dtype) for _ in range(w)]
        if coll in ("all_reduce", "reduce", "reduce_scatter"):
            op, fn = "torch.stack(parts).sum(0)", lambda: torch.stack(parts).sum(0)
        elif coll == "all_gather":
            op, fn = "torch.cat(parts)", lambda: torch.cat(parts)
        elif coll in ("all_to_all", "all_to_all_v"):
            big = torch.cat(parts).view(w, w, count // w)
            op, fn = "x.view(w,w,m).transpose(0,1).contiguous()", \
                lambda: big.transpose(0, 1).contiguous()
        elif coll == "broadcast":
            dst = torch.empty(w - 1, count, device=dev, dtype=dtype)
            op, fn = "dst[w-1,n].copy_(src.expand(w-1,n))", \
                lambda: dst.copy_(parts[0].unsqueeze(0).expand(w - 1, count))
        else:
            return None, None
        fn()
        us = statistics.median(measure(fn, self.cfg["iters"]) for _ in range(self.cfg["repeats"]))
        return op, us

    def time_all(self, deadline, copy_GBps):
        torch = self.torch
        from tilecomm.backends.base import CollectiveCall
        from tilecomm.types import lookup_dtype

        measure = self.timer()
        rows = []
        dt = torch.float32
        for coll, algo in self.kernels:
            spec = self.registry.KERNELS[(coll, algo)]
            for nbytes in self.cfg["time_bytes"]:
                count = max(self.w, nbytes // 4 // self.w * self.w)
                rec = dict(kernel=f"{coll}/{algo}", world=self.w, dtype="float32",
                           count=count, bytes=count * 4)
                if not self.agree(time.time() < deadline):
                    rows.append(dict(rec, error="skipped: world budget spent"))
                    continue
                err, us = None, None
                try:
                    call = self._timing_call(coll, algo, count, dt, CollectiveCall,
                                             lookup_dtype(dt))
                    self.backend.run(call)            # warm: compile, allocate, handshake
                    self.sync()

                    def once(spec=spec, call=call):
                        self.ctx.begin(False)
                        spec.launch(self.ctx, call)

                    samples = []
                    for _ in range(self.cfg["repeats"]):
                        self.backend.heap.barrier()
                        samples.append(measure(once, self.cfg["iters"]))
                    self.backend.heap.check(f"{coll}/{algo}")
                    us = statistics.median(samples)
                except Exception as e:  # noqa: BLE001 - reported
                    err = f"{type(e).__name__}: {str(e)[:300]}"
                alls = self.gather([-1 if us is None else int(us * 1000)])
                if any(a[0] < 0 for a in alls):
                    self.realign()
                    rows.append(dict(rec, error=err or "failed on another rank"))
                    continue
                slow = max(a[0] for a in alls) / 1000
                moved = _moved_bytes(coll, self.w, count * 4)
                op, ref_us = (None, None)
                if self.r == 0:
                    op, ref_us = self.torch_reference(coll, count, dt)
                self.backend.heap.barrier()
                size = count * 4 * (self.w if coll == "all_gather" else 1)
                algbw = size / slow / 1e3
                rows.append(dict(
                    rec, bytes=size, us=slow, us_per_rank=[a[0] / 1000 for a in alls],
                    algbw_GBps=algbw, busbw_GBps=algbw * BUSBW.get(coll, lambda w: 1.0)(self.w),
                    rank_bytes_moved=moved,
                    copy_bound_us=(moved / copy_GBps / 1e3) if copy_GBps else None,
                    torch_ref_op=op, torch_ref_us=ref_us))
                self.log(dict(phase="time", **rows[-1]))
        return rows

    def _timing_call(self, coll, algo, count, dt, CollectiveCall, d):
        torch = self.torch
        w, dev = self.w, self.device
        x = torch.randn(count, device=dev).to(dt)
        if coll in ("all_reduce", "reduce", "broadcast"):
            kw = {"op": _sum()} if coll != "broadcast" else {}
            return CollectiveCall(coll, algo, d, count, {"buf": x}, **kw)
        if coll == "all_gather":
            return CollectiveCall(coll, algo, d, count,
                                  {"in": x, "out": torch.empty(w * count, device=dev, dtype=dt)})
        if coll == "reduce_scatter":
            return CollectiveCall(coll, algo, d, count,
                                  {"in": x, "out": torch.empty(count // w, device=dev, dtype=dt)},
                                  op=_sum())
        if coll == "all_to_all":
            return CollectiveCall(coll, algo, d, count, {"in": x, "out": torch.empty_like(x)})
        if coll == "all_to_all_v":
            out = torch.empty_like(x)
            return CollectiveCall(coll, algo, d, count // w, {"in": x, "out": out},
                                  send_rows=[1] * w, recv_rows=[1] * w,
                                  make_out=lambda rows: out)
        raise NotImplementedError(f"gpu_check has no timing call for {coll}")

    # ---- 3. latency ---------------------------------------------------------------------------
    def latency(self, deadline):
        torch = self.torch
        from tilecomm.backends.base import CollectiveCall
        from tilecomm.types import lookup_dtype

        res = {}
        n_iter = self.cfg["latency_iters"]
        count = 8192 // 4
        algos = [a for (c, a) in self.kernels if c == "all_reduce"]
        x = torch.randn(count, device=self.device)
        y = torch.empty_like(x)
        host = self.backend.host

        def copy_barrier():
            y.copy_(x)
            self.sync()
            host.barrier()

        for name, fn in [("copy launch + host barrier", copy_barrier)] + [
                (f"all_reduce/{a} (backend.run)",
                 (lambda a=a: self.backend.run(CollectiveCall(
                     "all_reduce", a, lookup_dtype(torch.float32), count, {"buf": x},
                     op=_sum())))) for a in algos]:
            if not self.agree(time.time() < deadline):
                res[name] = "skipped: world budget spent"
                continue
            try:
                fn()
                host.barrier()
                t = time.perf_counter()
                for _ in range(n_iter):
                    fn()
                us = (time.perf_counter() - t) * 1e6 / n_iter
            except Exception as e:  # noqa: BLE001
                us = f"{type(e).__name__}: {str(e)[:200]}"
                self.realign()
            alls = self.gather([int(us * 1000) if isinstance(us, float) else -1])
            res[name] = (max(a[0] for a in alls) / 1000 if all(a[0] >= 0 for a in alls)
                         else (us if isinstance(us, str) else "failed on another rank"))
        return dict(bytes=8192, world=self.w, iters=n_iter, us_slowest_rank=res)


def _broken(launch):
    def run(ctx, call):
        made = []
        if call.make_out is not None:
            inner = call.make_out

            def make_out(rows):
                made.append(inner(rows))
                return made[-1]

            call.make_out = make_out
        launch(ctx, call)
        for t in [call.buffers.get("out"), call.buffers.get("buf")] + made:
            if t is not None and t.numel():
                t.view(-1)[0] += 1
                break
    return run


def _sum():
    from tilecomm.types import ReduceOp
    return ReduceOp.parse("sum")


def _moved_bytes(coll, w, nbytes):
    """Bytes one rank must at least write (its output that comes from peers) -- the copy bound."""
    if coll == "all_reduce":
        return 2 * (w - 1) / w * nbytes
    if coll in ("all_to_all", "all_to_all_v", "reduce_scatter"):
        return (w - 1) / w * nbytes
    if coll == "all_gather":
        return (w - 1) * nbytes
    return nbytes                                   # broadcast, reduce


def _device_props(torch):
    if not torch.cuda.is_available():
        return None
    p = torch.cuda.get_device_properties(0)
    return dict(name=p.name, sm_count=p.multi_processor_count,
                memory_GiB=round(p.total_memory / 2**30, 1), capability=f"{p.major}.{p.minor}",
                device_count=torch.cuda.device_count())


def rank_task(comm, cfg, partial_path, deadline, with_copy, with_latency):
    """Everything one rank does for one world size; returns rank 0's summary."""
    if cfg["interpret"]:
        os.environ["TRITON_INTERPRET"] = "1"
    out = dict(world=comm.world_size)
    try:
        rk = _Rank(comm, cfg, partial_path)
    except Exception as e:  # noqa: BLE001 - e.g. no CUDA IPC: reported for the whole world
        return dict(out, fatal=f"{type(e).__name__}: {e}", traceback=traceback.format_exc())
    out["kernels"] = [f"{c}/{a}" for c, a in rk.kernels]
    if comm.rank == 0:
        out["device"] = _device_props(rk.torch) if not cfg["interpret"] else "cpu (interpreter)"
    copy = rk.copy_bandwidth() if with_copy else None
    out["copy_bandwidth"] = copy
    # give correctness ~55% of the world's budget, timing the rest
    now = time.time()
    out["correctness"] = rk.check_all(now + 0.55 * (deadline - now))
    copy_GBps = (copy or {}).get("GBps") or cfg.get("copy_GBps")
    out["timing"] = rk.time_all(deadline - (8 if with_latency else 0), copy_GBps)
    if with_latency:
        out["latency_8k"] = rk.latency(deadline)
    rk.backend.heap.barrier()
    rk.backend.close()
    return out if comm.rank == 0 else None


# =============================================================================================
# parent side

def environment(interpret: bool) -> dict:
    import importlib.metadata as md

    import torch

    env = dict(python=platform.python_version(), platform=platform.platform(),
               torch=torch.__version__, torch_cuda=torch.version.cuda,
               cpu_count=os.cpu_count(), mode="interpret" if interpret else "gpu")
    try:
        env["triton"] = md.version("triton")
    except md.PackageNotFoundError:
        env["triton"] = None
    q = ("name,driver_version,pci.bus_id,memory.total,clocks.sm,clocks.mem,clocks.max.sm,"
         "clocks.max.mem,clocks.applications.graphics,power.draw,power.limit,temperature.gpu,"
         "persistence_mode,compute_mode,mig.mode.current,clocks_throttle_reasons.active")
    try:
        r = subprocess.run(["nvidia-smi", f"--query-gpu={q}", "--format=csv,noheader"],
                           capture_output=True, text=True, timeout=20)
        vals = [v.strip() for v in r.stdout.strip().splitlines()[0].split(",")] \
            if r.returncode == 0 and r.stdout.strip() else []
        env["nvidia_smi"] = dict(zip(q.split(","), vals)) if vals else \
            f"nvidia-smi failed: {r.stderr.strip()[:200]}"
    except (OSError, subprocess.TimeoutExpired) as e:
        env["nvidia_smi"] = f"unavailable ({type(e).__name__})"
    try:
        r = subprocess.run(["pgrep", "-f", "nvidia-cuda-mps-control"], capture_output=True,
                           timeout=5)
        env["mps_running"] = r.returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        env["mps_running"] = None
    return env


def run_world(w, cfg, budget_s, partial_dir, with_copy, with_latency, copy_GBps):
    """Run the rank task on a fresh group of w ranks with a watchdog; returns (summary, status)."""
    import tilecomm

    partial = os.path.join(partial_dir, f"w{w}.jsonl")
    deadline = time.time() + budget_s
    cfg = dict(cfg, copy_GBps=copy_GBps)
    group = tilecomm.RankGroup(w, timeout=30, heap_bytes=64 << 20, scratch_bytes=1 << 20)
    killed = threading.Event()

    def watchdog():
        killed.set()
        group.stop()

    timer = threading.Timer(budget_s + 15, watchdog)     # ranks check the deadline; this is
    timer.daemon = True                                   # for a rank stuck past it
    status = "ok"
    summary = None
    try:
        group.start()
        timer.start()
        res = group.run(rank_task, cfg, partial, deadline, with_copy, with_latency)
        summary = res[0]
        if summary and summary.get("fatal"):
            status = "failed: " + summary["fatal"]
    except BaseException as e:  # noqa: BLE001 - one world failing is reported
        status = ("killed by the watchdog" if killed.is_set() else "failed") + \
            f": {type(e).__name__}: {str(e)[:500]}"
    finally:
        timer.cancel()
        group.stop()
    if summary is None:                  # recover what rank 0 logged before the failure
        summary = dict(world=w, correctness=[], timing=[])
        if os.path.exists(partial):
            with open(partial) as f:
                lines = f.readlines()
            for line in lines:
                rec = json.loads(line)
                phase = rec.pop("phase")
                summary["correctness" if phase == "check" else "timing"].append(rec)
    return summary, status


def _fmt(v, nd=1):
    return "-" if v is None else (f"{v:.{nd}f}" if isinstance(v, float) else str(v))


def text_report(res) -> str:
    lines = [f"gpu_check ({res['env']['mode']}), {res['wall_s']:.0f} s, "
             f"torch {res['env']['torch']}, triton {res['env']['triton']}"]
    smi = res["env"].get("nvidia_smi")
    if isinstance(smi, dict):
        lines.append("GPU: " + ", ".join(f"{k}={v}" for k, v in smi.items()))
    else:
        lines.append(f"GPU: {smi}")
    cb = res.get("copy_bandwidth")
    if cb:
        lines.append(f"device copy: {cb['bytes'] >> 20} MiB in {cb['us']:.1f} us = "
                     f"{cb['GBps']:.1f} GB/s copied ({cb['read_plus_write_GBps']:.1f} GB/s "
                     f"read+write)")
    lines.append("")
    lines.append("worlds: " + ", ".join(f"{w}: {s}" for w, s in res["worlds"].items()))
    lines.append("")
    lines.append("correctness (cases passed / run, per kernel and world):")
    for k, per in res["correctness_summary"].items():
        cells = "  ".join(f"w{w}: {v['passed']}/{v['run']}" + (f" ({v['skipped']} skipped)"
                                                                if v["skipped"] else "")
                          for w, v in per["worlds"].items())
        lines.append(f"  {'PASS' if per['ok'] else 'FAIL'} {k:28s} {cells}")
        for e in per["errors"][:3]:
            lines.append(f"       {e}")
    lines.append("")
    lines.append("timing, float32 (us: slowest rank, median of repeats of a launch loop; "
                 "copy bound: bytes a rank must write / device copy rate):")
    lines.append(f"  {'kernel':26s} {'w':>2s} {'bytes':>10s} {'us':>10s} {'busbw GB/s':>10s} "
                 f"{'copy bound':>10s} {'torch ref':>10s}")
    for t in res["timing"]:
        if t.get("error"):
            lines.append(f"  {t['kernel']:26s} {t['world']:2d} {t['bytes']:10d}  {t['error']}")
            continue
        lines.append(f"  {t['kernel']:26s} {t['world']:2d} {t['bytes']:10d} {t['us']:10.1f} "
                     f"{t['busbw_GBps']:10.2f} {_fmt(t['copy_bound_us']):>10s} "
                     f"{_fmt(t['torch_ref_us']):>10s}")
    lat = res.get("latency_8k")
    if lat:
        lines.append("")
        lines.append(f"8 KB latency, {lat['world']} ranks (us per call, slowest rank, "
                     f"{lat['iters']} calls):")
        for k, v in lat["us_slowest_rank"].items():
            lines.append(f"  {k:40s} {_fmt(v)}")
    lines.append("")
    skipped = res.get("skipped_cases", 0)
    verdict = "all kernels correct" if res["all_correct"] else "FAILURES"
    if res["all_correct"] and skipped:
        verdict = f"INCOMPLETE: no failure, but {skipped} cases skipped (budget spent)"
    lines.append(f"RESULT: {verdict} ({len(res['kernels'])} kernels: "
                 f"{', '.join(res['kernels'])})")
    return "\n".join(lines)


def summarize(res):
    per: dict = {}
    for c in res["correctness"]:
        k = per.setdefault(c["kernel"], dict(ok=True, worlds={}, errors=[]))
        wv = k["worlds"].setdefault(str(c["world"]), dict(run=0, passed=0, skipped=0))
        if c["ok"] is None:
            wv["skipped"] += 1
            continue
        wv["run"] += 1
        wv["passed"] += int(bool(c["ok"]))
        if not c["ok"]:
            k["ok"] = False
            k["errors"].append(f"w{c['world']} {c['dtype']} n={c['count']}: {c['error']}")
    for k in res["kernels"]:
        e = per.setdefault(k, dict(ok=False, worlds={}, errors=["no correctness case ran"]))
        if not any(v["run"] for v in e["worlds"].values()):
            e["ok"] = False
    res["correctness_summary"] = dict(sorted(per.items()))
    # A case the budget skipped is not a pass: report it in the verdict and the exit status.
    res["skipped_cases"] = sum(w["skipped"] for k in per.values() for w in k["worlds"].values())
    res["all_correct"] = bool(per) and all(v["ok"] for v in per.values()) and \
        all(s == "ok" for s in res["worlds"].values())


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--interpret", action="store_true",
                   help="CPU dry run: TRITON_INTERPRET=1, 2 CPU ranks, tiny sizes, perf_counter")
    p.add_argument("--worlds", default=None, help="comma-separated world sizes (2,4,8)")
    p.add_argument("--budget", type=float, default=None,
                   help="seconds for all worlds together (default 240 GPU, 45 interpret)")
    p.add_argument("--out", default=None, help="output folder (default $OUT or ./gpu_check_out)")
    p.add_argument("--kernels", default=None,
                   help="comma-separated collective/algo to run (default: every registered one)")
    p.add_argument("--device-timeout", type=float, default=None,
                   help="seconds a device wait polls before giving up (default 5)")
    p.add_argument("--break", dest="brk", default=None, metavar="KERNEL",
                   help="testing: rank 0 skips KERNEL's launches (it must be reported failing)")
    a = p.parse_args(argv)
    t0 = time.time()
    if a.interpret:
        os.environ["TRITON_INTERPRET"] = "1"     # before any triton import (ranks fork later)
    worlds = [int(x) for x in a.worlds.split(",")] if a.worlds else None
    cfg = _config(a.interpret, worlds)
    cfg["kernels"] = a.kernels.split(",") if a.kernels else None
    cfg["break"] = a.brk
    if a.device_timeout:
        cfg["device_timeout"] = a.device_timeout
    out_dir = a.out or os.environ.get("OUT") or "./gpu_check_out"
    os.makedirs(out_dir, exist_ok=True)
    env = environment(a.interpret)
    budget = a.budget or (45.0 if a.interpret else 240.0)
    res = dict(env=env, config=cfg, worlds={}, kernels=[], correctness=[], timing=[],
               copy_bandwidth=None, latency_8k=None)
    share = [w for w in cfg["worlds"]]
    copy_GBps = None
    with tempfile.TemporaryDirectory(prefix="gpu_check_") as tmp:
        for i, w in enumerate(cfg["worlds"]):
            left = budget - (time.time() - t0)
            # bigger worlds get more; the first also pays for compiling the kernels
            per_world = left * (w + 4) / sum(x + 4 for x in share[i:])
            if per_world < 5:
                res["worlds"][str(w)] = "skipped: budget spent"
                continue
            print(f"[gpu_check] world {w}: {per_world:.0f} s budget", flush=True)
            summary, status = run_world(w, cfg, per_world, tmp, with_copy=(i == 0),
                                        with_latency=(w == max(cfg["worlds"])),
                                        copy_GBps=copy_GBps)
            res["worlds"][str(w)] = status
            for k in summary.get("kernels", []):
                if k not in res["kernels"]:
                    res["kernels"].append(k)
            res["correctness"] += summary.get("correctness", [])
            res["timing"] += summary.get("timing", [])
            if summary.get("copy_bandwidth"):
                res["copy_bandwidth"] = summary["copy_bandwidth"]
                copy_GBps = summary["copy_bandwidth"]["GBps"]
            if summary.get("latency_8k"):
                res["latency_8k"] = summary["latency_8k"]
            if summary.get("device"):
                res["device"] = summary["device"]
            if summary.get("traceback"):
                res.setdefault("tracebacks", {})[str(w)] = summary["traceback"]
            print(f"[gpu_check] world {w}: {status}", flush=True)
    res["wall_s"] = time.time() - t0
    summarize(res)
    with open(os.path.join(out_dir, "gpu_check.json"), "w") as f:
        json.dump(res, f, indent=1, default=str)
    text = text_report(res)
    with open(os.path.join(out_dir, "gpu_check.txt"), "w") as f:
        f.write(text + "\n")
    print(text)
    if not res["all_correct"]:
        return 1
    return 2 if res["skipped_cases"] else 0     # 2: nothing failed, but not everything ran


if __name__ == "__main__":
    sys.exit(main())

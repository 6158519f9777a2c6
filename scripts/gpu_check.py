#!/usr/bin/env python
"""Check and time every registered GPU kernel in one command (a lent H200: < 5 minutes).

    python scripts/gpu_check.py                 # GPU: 2, 4 and 8 ranks sharing cuda:0 (+ a
                                                # 2-GPU world when two GPUs see each other)
    python scripts/gpu_check.py --interpret     # CPU dry run (Triton interpreter, 2 ranks)

It runs the case table of ``tilecomm bench`` (``tilecomm.bench.cases.kernel_table`` over
``tilecomm.backends.triton.registry.KERNELS``: every kernel, every dtype and reduction it
registers, ordinary (staged) and ``comm.alloc(..., device="cuda")`` (zero-copy) tensors)
through the bench's own rank code (``tilecomm.bench.runner``), i.e. through the public
``comm.all_reduce(t)``-style calls on CUDA tensors:

0. **preflight** (parent, GPU probe in a subprocess so that the parent never initializes
   CUDA before the ranks fork): CUDA driver version (``cuDriverGetVersion``, nvidia-smi) vs
   the ptxas Triton bundles (``ptxas --version``), a tiny Triton kernel compiled and run,
   compute mode, MIG mode, MPS (control daemon / pipe), peer access between visible GPUs,
   NVLink. A machine that cannot run the check gets ``RESULT: CANNOT RUN`` and exit 3.
1. **warm-up**: every kernel once (compiles; not timed, not judged).
2. **correctness**: every table row, two consecutive calls, fresh random integers per call
   (exact in every dtype), outputs poisoned, roots and all_to_all_v splits (zeros too) drawn
   per call, compared exactly with a torch reference of every rank's inputs.
3. **back-to-back**: a sequence of calls of different kernels, sizes and memory kinds issued
   with no synchronization between them, then every result verified.
4. **timing** (float32 sum; both memory kinds): the bench's timed rounds (CUDA events),
   slowest rank's median; bound: NVLink bandwidth between GPUs where there is NVLink, else
   the device copy rate measured in the same run.
4b. **fused ops** (``scripts/gpu_check_overlap.py``): ``tilecomm.ops.all_gather_matmul``
   (``copy="kernel"`` and ``copy="stream"``) and ``matmul_reduce_scatter`` against their
   references, then timed against ``torch.matmul`` + tilecomm's collective (unfused) and
   PyTorch's ``torch.ops.symm_mem`` fused ops where the installed torch has them.
5. **latency**: 8 KB all_reduce per call (eager, heap tensor) vs a copy + host barrier, and
   the same call captured in a ``torch.cuda.CUDAGraph`` and replayed (a capture that fails is
   that case's failure).

Writes ``$OUT/gpu_check.json`` and ``$OUT/gpu_check.txt`` (``$OUT`` unset: ./gpu_check_out) and
prints the table last. Never changes GPU settings (nvidia-smi is only read).

Exit status: 0 PASS (every case ran and passed); 1 FAIL (a case failed, or a world did not
finish); 2 INCOMPLETE (nothing failed, but the time budget skipped cases); 3 CANNOT RUN
(preflight: this machine cannot run the check).
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import re
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import traceback

EXIT_PASS, EXIT_FAIL, EXIT_INCOMPLETE, EXIT_CANNOT_RUN = 0, 1, 2, 3
if os.path.dirname(os.path.abspath(__file__)) not in sys.path:    # gpu_check_overlap beside
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))


def _config(interpret: bool) -> dict:
    if interpret:
        return dict(interpret=True, worlds=[[2, "cpu"]], check_sizes=[8, 148],
                    full_sizes=[148], mix_mems=True, cover=True, time_sizes=[1024], iters=2,
                    rounds=2, warmup=1, device_timeout=5.0, latency_iters=3, seq_len=6,
                    copy_bytes=8 << 20, budget=600.0, plan_sizes=[148], bits_sizes=[600],
                    overlap_check_shapes=[[5, 24, 20]], overlap_dtypes=["float32", "bfloat16"],
                    overlap_time_shapes=[[8, 16, 16]], overlap_time_dtype="float32",
                    overlap_iters=1, overlap_rounds=2)
    return dict(interpret=False, worlds=[[2, "cuda:0"], [4, "cuda:0"], [8, "cuda:0"]],
                check_sizes=[4, 4012, 262164, 4 << 20], full_sizes=[4012, 262164],
                mix_mems=False, time_sizes=[8 << 10, 1 << 20, 16 << 20], iters=20, rounds=5,
                warmup=3, device_timeout=5.0, latency_iters=200, seq_len=24,
                copy_bytes=256 << 20, budget=240.0, plan_sizes=[4012, 262164],
                bits_sizes=[4012, 262164],
                # fused ops: m rows per rank, K, N (8 ranks x 512 rows = a 4096-token TP GEMM)
                overlap_check_shapes=[[300, 256, 200]], overlap_dtypes=["float32", "bfloat16"],
                overlap_time_shapes=[[512, 4096, 4096]], overlap_time_dtype="bfloat16",
                overlap_iters=5, overlap_rounds=3)


# =============================================================================================
# rank side

class _Rank:
    def __init__(self, comm, cfg, device, partial_path):
        import torch

        from tilecomm.backends.triton import _HostComm, registry
        from tilecomm.bench import runner

        self.torch, self.runner, self.registry = torch, runner, registry
        self.comm, self.cfg = comm, cfg
        self.w, self.r = comm.world_size, comm.rank
        self.partial = partial_path if comm.rank == 0 else None
        self.host = _HostComm(comm)
        if cfg["interpret"]:
            comm.use_cpu_kernels("triton")
        self.dev = torch.device(runner._rank_setup(
            comm, device, None if cfg["interpret"] else cfg["device_heap_bytes"]))
        self.kernels = dict(sorted(registry.load().items()))
        if cfg.get("kernels"):
            self.kernels = {k: v for k, v in self.kernels.items()
                            if f"{k[0]}/{k[1]}" in cfg["kernels"]}
        # the plan kernel as the kernel of every registered schedule (fused kernels off)
        from tilecomm.algorithms.registry import algorithms
        from tilecomm.bench.cases import CASES
        self.plans = {}
        for op in CASES:
            for a in algorithms(op):
                spec = registry.plan_spec(op, a)
                if spec is not None and (not cfg.get("kernels") or f"{op}/{a}" in cfg["kernels"]
                                         or f"{op}/{a}/plan" in cfg["kernels"]):
                    self.plans[(op, a)] = spec

    def engine(self, name: str):
        """Route the next calls to the fused kernels (``fused``: the setting, as the bench
        does) or to the plan kernel (``plan``: registry.FUSED = False)."""
        self.registry.FUSED = False if name == "plan" else None
        specs = getattr(self.backend(), "_specs", None)
        if isinstance(specs, dict):
            specs.clear()

    # ---- agreement among ranks (host executor, never the kernels under test) -----------------
    def gather(self, ints):
        t = self.host.all_gather(self.torch.tensor(ints, dtype=self.torch.int64))
        return t.view(self.w, -1).tolist()

    def gather_text(self, text: str | None, nbytes: int = 320) -> list[str]:
        """Every rank's ``text`` (its first ``nbytes`` UTF-8 bytes; "" for None)."""
        raw = (text or "").encode()[:nbytes].ljust(nbytes, b"\0")
        words = self.torch.frombuffer(bytearray(raw), dtype=self.torch.int64).tolist()
        rows = self.gather(words)
        return [self.torch.tensor(r, dtype=self.torch.int64).numpy().tobytes()
                .rstrip(b"\0").decode(errors="replace") for r in rows]

    def agree(self, flag: bool) -> bool:
        """Rank 0's decision, on every rank."""
        return bool(self.gather([int(flag)])[0][0])

    def backend(self):
        return self.comm._backends.get(self.dev.type)

    def sync(self):
        if self.dev.type == "cuda":
            self.torch.cuda.synchronize(self.dev)

    def realign(self):
        """After a failure: every rank finishes its kernels, then all take the largest epoch
        (signals only grow, so stale ones stay below every later epoch)."""
        try:
            self.sync()
        except Exception:  # noqa: BLE001 - a sticky CUDA error: reported by the next case
            pass
        be = self.backend()
        heap = getattr(be, "heap", None)
        if heap is not None:
            heap.errors.zero_()
            top = max(e[0] for e in self.gather([heap._epoch]))
            heap._epoch = top + 2
            heap.barrier()
        else:
            self.host.barrier()

    def log(self, rec):
        if self.partial:
            with open(self.partial, "a") as f:
                f.write(json.dumps(rec, default=str) + "\n")

    def tables(self):
        from tilecomm.bench.cases import kernel_table
        c = self.cfg
        check = kernel_table(self.kernels, self.w, c["check_sizes"], full_sizes=c["full_sizes"],
                             mix_mems=c["mix_mems"], dtypes=c.get("dtypes"),
                             cover=c.get("cover", False))
        check += kernel_table(self.plans, self.w, c["check_sizes"], full_sizes=c["plan_sizes"],
                              mix_mems=True, dtypes=["float32", "bfloat16"],
                              redops=["sum", "avg"], engine="plan")
        timing = kernel_table(self.kernels, self.w, c["time_sizes"], dtypes=["float32"],
                              redops=["sum"])
        return check, timing

    def bits_table(self):
        """Reducing collectives on random floats: every fused kernel (fp32/bf16/fp16, sum and
        avg) against its plan-kernel twin, and the plan kernel's rank-ordered schedules that
        have no fused kernel against the host reference."""
        from tilecomm.algorithms.lower import deterministic_algorithms
        from tilecomm.bench.cases import CASES, BenchCase, _callable
        rows, turn = [], 0
        for (op, algo), plan in sorted(self.plans.items()):
            if not CASES[op].reduces:
                continue
            fused = self.kernels.get((op, algo))
            if fused is None and algo not in deterministic_algorithms(op, self.w):
                continue        # nothing to compare the plan kernel's bits with
            spec = fused or plan
            for dt in ("float32", "bfloat16", "float16"):
                if getattr(self.torch, dt) not in spec.dtypes:
                    continue
                for red in ("sum", "avg"):
                    if red not in spec.ops or not _callable(dt, red):
                        continue
                    for n in self.cfg["bits_sizes"]:
                        mem, turn = ("user", "heap")[turn % 2], turn + 1
                        rows.append(BenchCase(op, algo, dt, n, mem, red, self.w, "bits"))
        return rows

    # ---- 1. warm-up ----------------------------------------------------------------------------
    def warm(self):
        from tilecomm.bench.cases import BenchCase
        t0 = time.perf_counter()
        for engine, keys in (("fused", self.kernels), ("plan", self.plans)):
            self.engine(engine)
            try:
                for (op, algo) in keys:
                    case = BenchCase(op, algo, "float32", 4096, "user", "sum", self.w, engine)
                    try:
                        bufs = self.runner.make_buffers(self.comm, case, self.dev)
                        self.runner.check_case(self.comm, case, bufs, self.dev, calls=1)
                        ok = True
                    except Exception:  # noqa: BLE001 - judged in the correctness pass
                        ok = False
                    if not all(s[0] for s in self.gather([int(ok)])):
                        self.realign()
                    bufs = None
                    gc.collect()
            finally:
                self.engine("fused")
        return round(time.perf_counter() - t0, 3)

    # ---- 2. correctness --------------------------------------------------------------------
    def _judged(self, rec, fn):
        """Run ``fn() -> wrong elements``; every rank learns every rank's outcome."""
        err, wrong, raised = None, 0, False
        t0 = time.perf_counter()
        try:
            wrong = fn()
            if wrong:
                err = f"{wrong} wrong elements"
        except Exception as e:  # noqa: BLE001 - reported, not fatal
            raised = True
            err = f"{type(e).__name__}: {str(e)[:400]}"
        status = self.gather([int(err is None), int(raised)])
        ok = all(s[0] for s in status)
        if not ok:
            if err is None:              # say what the failing rank saw (the first of them)
                texts = self.gather_text(None)
                q = next(q for q, s in enumerate(status) if not s[0])
                err = f"failed on rank {q}: {texts[q]}"
            else:
                self.gather_text(err)
            self.realign()
        return dict(rec, ok=ok, ranks_failed=[q for q, s in enumerate(status) if not s[0]],
                    error=err,
                    seconds=round(time.perf_counter() - t0, 4))

    def _rec(self, case):
        n, _, _ = self.runner.case_counts(case)
        return dict(case=case.id, kernel=case.kernel, world=self.w, dtype=case.dtype,
                    redop=case.redop, mem=case.mem, bytes=case.nbytes, count=n,
                    engine=case.engine)

    def check_all(self, table, deadline):
        out = []
        for i, case in enumerate(table):
            rec = self._rec(case)
            if not self.agree(time.time() < deadline):
                out.append(dict(rec, ok=None, error="skipped: world budget spent"))
                continue

            def fn(case=case, i=i):
                bufs = self.runner.make_buffers(self.comm, case, self.dev)
                self.engine(case.engine)
                try:
                    return self.runner.check_case(self.comm, case, bufs, self.dev,
                                                  seed=100 + i, calls=2)
                finally:
                    self.engine("fused")
            rec = self._judged(rec, fn)
            if not rec["ok"]:   # a traceback may hold heap tensors: free them in step
                gc.collect()
            out.append(rec)
            self.log(dict(phase="check", **rec))
        return out

    # ---- 2b. bits (random floats) -------------------------------------------------------
    _BITS = {"float32": "int32", "bfloat16": "int16", "float16": "int16"}

    def _bits(self, t, dtype):
        # a copy: on CPU tensors .cpu()/.contiguous() return views, and the next engine's
        # call overwrites the buffer (the fused result then read as the plan kernel's)
        return t.detach().reshape(-1).cpu().clone().view(getattr(self.torch, self._BITS[dtype]))

    def _differ(self, a, b):
        return int(b.numel()) if a.shape != b.shape else int((a != b).sum())

    def bits_all(self, table, deadline):
        """Each row: random floats of mixed magnitudes (every rank's seeded inputs), one call
        through the fused kernel and one through the plan kernel on the same inputs; the bit
        patterns must be equal, and equal to reference.rank_order_reduced of every rank's
        inputs (computed here) for the rank-ordered schedules (lower.deterministic_algorithms)."""
        from tilecomm.algorithms.lower import deterministic_algorithms
        from tilecomm.bench.cases import CASES, POISON, BenchCase, random_data
        from tilecomm.types import DTYPE_BY_NAME
        out = []
        for i, case in enumerate(table):
            rec = self._rec(case)
            if not self.agree(time.time() < deadline):
                out.append(dict(rec, ok=None, error="skipped: world budget spent"))
                continue
            seed = 5000 + i
            root = seed % self.w
            ordered = case.algo in deterministic_algorithms(case.op, self.w, root)
            if not ordered and (case.op, case.algo) not in self.kernels:
                root = 0        # plan kernel alone: the root its schedule reduces in rank order
                ordered = case.algo in deterministic_algorithms(case.op, self.w, root)
            engines = (["fused"] if (case.op, case.algo) in self.kernels else []) + ["plan"]
            rec.update(engines=engines, vs_reference=ordered, root=root)
            detail = []

            def fn(case=case, seed=seed, root=root, ordered=ordered, engines=engines,
                   detail=detail):
                c = CASES[case.op]
                plain = BenchCase(case.op, case.algo, case.dtype, case.nbytes, case.mem,
                                  case.redop, case.world)
                bufs = self.runner.make_buffers(self.comm, plain, self.dev)
                dt = DTYPE_BY_NAME[case.dtype].torch
                inputs = [random_data(seed, j, bufs.inp.numel(), dt) for j in range(self.w)]
                got = {}
                for eng in engines:
                    self.engine(eng)
                    try:
                        bufs.inp.copy_(inputs[self.r])
                        bufs.root, bufs.redop = root, case.redop
                        if bufs.out is not None:
                            bufs.out.fill_(POISON)
                        c.run(self.comm, bufs, case.algo)
                        self.sync()
                    finally:
                        self.engine("fused")
                    got[eng] = self._bits(self.runner.result_of(plain, bufs), case.dtype)
                wrong = 0
                if "fused" in got:
                    k = self._differ(got["fused"], got["plan"])
                    if k:
                        detail.append(f"fused vs plan kernel: {k}")
                    wrong = max(wrong, k)
                if ordered:
                    want = self._bits(c.expected(inputs, self.r, self.w, bufs), case.dtype)
                    for eng, g in got.items():
                        k = self._differ(g, want)
                        if k:
                            detail.append(f"{eng} vs rank-order reference: {k}")
                        wrong = max(wrong, k)
                return wrong
            rec = self._judged(rec, fn)
            if detail:
                rec["error"] = f"bits differ ({'; '.join(detail)} elements)"
            if not rec["ok"]:
                gc.collect()
            out.append(rec)
            self.log(dict(phase="check", **rec))
        return out

    def deterministic_case(self, deadline):
        """comm.deterministic = True, algo auto, random bf16 sum at the smallest size auto sends
        to two_shot: the bits must be reference.rank_order_reduced's."""
        from tilecomm import reference, tuner
        from tilecomm.algorithms.lower import deterministic_algorithms
        from tilecomm.bench.cases import random_data
        torch = self.torch
        be = self.comm._backend_for_device(self.dev.type)
        avail = deterministic_algorithms("all_reduce", self.w,
                                         among=be.algorithms("all_reduce"))
        nbytes = 8 << 10
        while nbytes < (64 << 20) and tuner.choose("all_reduce", nbytes, self.w, kind=be.kind,
                                                   available=avail) != "two_shot":
            nbytes *= 2
        count = nbytes // 2
        from tilecomm.units import format_size
        rec = dict(case=f"all_reduce/auto/sum/bfloat16/heap/{format_size(nbytes)}/w{self.w}"
                        f"/deterministic", kernel="all_reduce/deterministic", world=self.w,
                   dtype="bfloat16", redop="sum", mem="heap", bytes=nbytes, count=count,
                   engine="fused", algo_auto=tuner.choose("all_reduce", nbytes, self.w,
                                                          kind=be.kind, available=avail))
        if not self.agree(time.time() < deadline):
            return dict(rec, ok=None, error="skipped: world budget spent")

        def fn():
            inputs = [random_data(77, j, count, torch.bfloat16) for j in range(self.w)]
            x = self.runner.heap_alloc(self.comm, count, torch.bfloat16, self.dev)
            x.copy_(inputs[self.r])
            self.comm.deterministic = True
            try:
                self.comm.all_reduce(x, "sum")
                self.sync()
            finally:
                self.comm.deterministic = False
            return self._differ(self._bits(x, "bfloat16"),
                                self._bits(reference.rank_order_reduced(inputs), "bfloat16"))
        out = self._judged(rec, fn)
        if out["error"] and "wrong elements" in out["error"]:
            out["error"] = out["error"].replace("wrong elements",
                                                "elements' bits differ from rank order")
        gc.collect()
        self.log(dict(phase="check", **out))
        return out

    # ---- 3. back-to-back -------------------------------------------------------------------
    def sequence(self, table, deadline):
        """Calls of different kernels/sizes/memory kinds issued back to back (no sync, no
        check in between), then each result verified."""
        from tilecomm.bench.cases import CASES
        picks, seen = [], set()
        for case in table:      # one per (kernel, size, mem), float32 sum, round-robin
            key = (case.kernel, case.nbytes, case.mem)
            if case.dtype == "float32" and case.redop == "sum" and key not in seen:
                seen.add(key)
                picks.append(case)
        by_kernel: dict = {}
        for c in picks:
            by_kernel.setdefault(c.kernel, []).append(c)
        seq = []
        while len(seq) < self.cfg["seq_len"] and any(by_kernel.values()):
            for k in list(by_kernel):
                if by_kernel[k] and len(seq) < self.cfg["seq_len"]:
                    seq.append(by_kernel[k].pop(len(by_kernel[k]) // 2))
        rec = dict(case=f"sequence/{len(seq)}/w{self.w}", kernel="back-to-back sequence",
                   world=self.w, calls=[c.id for c in seq])
        if not self.agree(time.time() < deadline):
            return dict(rec, ok=None, error="skipped: world budget spent")
        wrong_at = []

        def fn():
            made = [(c, self.runner.make_buffers(self.comm, c, self.dev)) for c in seq]
            wants = [self.runner.prepare_call(self.comm, c, b, 7000 + i)
                     for i, (c, b) in enumerate(made)]
            self.sync()
            try:
                for c, b in made:
                    self.engine(c.engine)
                    CASES[c.op].run(self.comm, b, c.algo)
            finally:
                self.engine("fused")
            self.sync()
            total = 0
            for (c, b), want in zip(made, wants):
                k = self.runner.count_wrong(self.runner.result_of(c, b), want)
                if k:
                    wrong_at.append(c.id)
                total += k
            return total
        out = self._judged(rec, fn)
        if wrong_at:
            out["error"] = f"{out['error']} in {', '.join(wrong_at[:4])}"
        gc.collect()
        self.log(dict(phase="check", **out))
        return out

    # ---- 4. timing ----------------------------------------------------------------------------
    def copy_bandwidth(self):
        """GB/s of one device-to-device copy (bytes copied / time), rank 0 alone."""
        torch = self.torch
        res = None
        if self.r == 0:
            n = self.cfg["copy_bytes"] // 4
            a = torch.randn(n, device=self.dev)
            b = torch.empty_like(a)
            clock = self.runner.Clock(self.dev)
            b.copy_(a)
            secs = []
            for _ in range(5):
                clock.reset()
                clock.start()
                for _ in range(5):
                    b.copy_(a)
                clock.stop()
                secs.append(clock.seconds() / 5)
            us = statistics.median(secs) * 1e6
            res = dict(bytes=n * 4, us=us, GBps=n * 4 / us / 1e3,
                       read_plus_write_GBps=2 * n * 4 / us / 1e3)
            del a, b
        self.host.barrier()
        return res

    def time_all(self, table, deadline, bounds):
        from tilecomm.bench.cases import CASES
        rows = []
        c = self.cfg
        gpus = len({(q % max(1, bounds.get("device_count", 1)))
                    for q in range(self.w)}) if bounds.get("spread") else 1
        for case in table:
            rec = self._rec(case)
            if not self.agree(time.time() < deadline):
                rows.append(dict(rec, error="skipped: world budget spent"))
                continue
            secs, err = None, None
            try:
                bufs = self.runner.make_buffers(self.comm, case, self.dev)
                secs = self.runner.time_case(self.comm, case, bufs, self.dev, c["warmup"],
                                             c["iters"], c["rounds"])
            except Exception as e:  # noqa: BLE001 - reported
                err = f"{type(e).__name__}: {str(e)[:300]}"
            bufs = None
            gc.collect()
            alls = self.gather([int(x * 1e9) for x in secs] if secs else [-1] * c["rounds"])
            if any(a[0] < 0 for a in alls):
                self.realign()
                rows.append(dict(rec, error=err or "failed on another rank"))
                continue
            t = self.runner.slowest_median([[v / 1e9 for v in a] for a in alls])
            n, _, _ = self.runner.case_counts(case)
            size = n * 4
            algbw = size / t / 1e9
            moved = _moved_bytes(case.op, self.w, size)
            row = dict(rec, bytes=size, us=t * 1e6, algbw_GBps=algbw,
                       busbw_GBps=algbw * CASES[case.op].factor(self.w),
                       rank_bytes_moved=moved)
            if gpus > 1 and bounds.get("nvlink_GBps"):
                row.update(bound="nvlink", bound_us=moved / bounds["nvlink_GBps"] / 1e3)
            elif gpus > 1 and bounds.get("peer_copy_GBps"):
                row.update(bound="peer copy", bound_us=moved / bounds["peer_copy_GBps"] / 1e3)
            elif bounds.get("copy_GBps"):
                # ranks sharing one GPU share its memory: all of them write `moved` bytes
                share = self.w // gpus
                row.update(bound="device copy",
                           bound_us=share * moved / bounds["copy_GBps"] / 1e3)
            row["copy_bound_us"] = row.get("bound_us")
            if row.get("bound_us"):
                row["frac_of_bound"] = row["bound_us"] / row["us"]
            rows.append(row)
            self.log(dict(phase="time", **row))
        return rows

    # ---- 5. latency -------------------------------------------------------------------------
    def latency(self, deadline):
        torch = self.torch
        from tilecomm.bench.cases import BenchCase
        n_iter = self.cfg["latency_iters"]
        count = 8192 // 4
        res = {}
        x = torch.ones(count, device=self.dev)
        y = torch.empty_like(x)

        def copy_barrier():
            y.copy_(x)
            self.sync()
            self.comm.barrier()

        fns = [("copy launch + host barrier", copy_barrier)]
        algos = [a for (op, a) in self.kernels if op == "all_reduce"]
        for a in algos:
            case = BenchCase("all_reduce", a, "float32", 8192, "heap", "avg", self.w)
            fns.append((f"all_reduce/{a} (comm.all_reduce, heap, 8 KB)", case))
        for name, fn in fns:
            if not self.agree(time.time() < deadline):
                res[name] = "skipped: world budget spent"
                continue
            us = None
            try:
                if isinstance(fn, BenchCase):   # avg of equal values: no growth, no refill
                    bufs = self.runner.make_buffers(self.comm, fn, self.dev)
                    s = self.runner.time_case(self.comm, fn, bufs, self.dev, 2, n_iter, 1)
                    us = s[0] * 1e6
                    bufs = None
                else:
                    fn()
                    self.comm.barrier()
                    t = time.perf_counter()
                    for _ in range(n_iter):
                        fn()
                    us = (time.perf_counter() - t) * 1e6 / n_iter
            except Exception as e:  # noqa: BLE001
                us = f"{type(e).__name__}: {str(e)[:200]}"
                self.realign()
            gc.collect()
            alls = self.gather([int(us * 1000) if isinstance(us, float) else -1])
            res[name] = (max(a[0] for a in alls) / 1000 if all(a[0] >= 0 for a in alls)
                         else (us if isinstance(us, str) else "failed on another rank"))
        return dict(bytes=8192, world=self.w, iters=n_iter, us_slowest_rank=res)

    def graph_replay(self, deadline):
        """8 KB all_reduce on a heap tensor captured in a CUDAGraph, replayed: each replay's
        result checked once, then replays timed. A capture that fails is this case's failure."""
        torch = self.torch
        rec = dict(case=f"all_reduce/graph/sum/float32/heap/8K/w{self.w}",
                   kernel="all_reduce/graph", world=self.w)
        if self.dev.type != "cuda":
            return dict(rec, ok=None, applicable=False,
                        error="n/a: CUDA graphs need a GPU (interpret mode)")
        if not self.agree(time.time() < deadline):
            return dict(rec, ok=None, error="skipped: world budget spent")
        from tilecomm.bench.cases import exact_data
        count = 8192 // 4
        timing = {}

        def fn():
            x = self.comm.alloc((count,), torch.float32, device="cuda")
            x.fill_(1)
            self.comm.all_reduce(x)         # warm outside the capture
            self.sync()
            g = torch.cuda.CUDAGraph()
            try:
                with torch.cuda.graph(g):
                    self.comm.all_reduce(x)
            except Exception as e:  # noqa: BLE001
                raise RuntimeError(f"capture failed: {type(e).__name__}: {str(e)[:300]}")
            self.sync()
            wrong = 0
            for k in range(2):              # two replays on fresh data, each verified
                ins = [exact_data(900 + k, j, count, torch.float32) for j in range(self.w)]
                x.copy_(ins[self.r])
                self.sync()
                self.comm.barrier()
                g.replay()
                self.sync()
                wrong += self.runner.count_wrong(x, torch.stack(ins).sum(0))
            chunk = self.runner.safe_chunk("all_reduce", torch.float32, self.w)
            secs = self.runner.time_rounds(self.comm.barrier, g.replay, 3,
                                           self.cfg["latency_iters"], 3,
                                           refill=lambda: x.fill_(1), chunk=chunk,
                                           clock=self.runner.Clock(self.dev))
            timing["us"] = statistics.median(secs) * 1e6
            return wrong
        out = self._judged(rec, fn)
        alls = self.gather([int(timing.get("us", -1) * 1000)])
        if out["ok"] and all(a[0] >= 0 for a in alls):
            out["us_per_replay_slowest_rank"] = max(a[0] for a in alls) / 1000
        gc.collect()
        self.log(dict(phase="check", **out))
        return out


def _moved_bytes(coll, w, nbytes):
    """Bytes one rank must at least write (its output that comes from peers) -- the bound."""
    if coll == "all_reduce":
        return 2 * (w - 1) / w * nbytes
    if coll in ("all_to_all", "all_to_all_v", "reduce_scatter"):
        return (w - 1) / w * nbytes
    if coll == "all_gather":
        return (w - 1) / w * nbytes          # nbytes: the output
    return nbytes                            # broadcast, reduce


def rank_task(comm, cfg, device, partial_path, deadline, flags, bounds, rank_setup=None):
    """Everything one rank does for one world; returns rank 0's summary."""
    if cfg["interpret"]:
        os.environ["TRITON_INTERPRET"] = "1"
    out = dict(world=comm.world_size, device=device)
    try:
        if rank_setup is not None:
            rank_setup(comm)
        rk = _Rank(comm, cfg, device, partial_path)
        check_table, time_table = rk.tables()
    except Exception as e:  # noqa: BLE001 - e.g. no CUDA IPC: reported for the whole world
        return dict(out, fatal=f"{type(e).__name__}: {e}", traceback=traceback.format_exc())
    out["kernels"] = [f"{c}/{a}" for c, a in rk.kernels] + \
        [f"{c}/{a}/plan" for c, a in rk.plans]
    bits_table = rk.bits_table()
    out["table"] = [c.id for c in check_table]
    out["bits_table"] = [c.id for c in bits_table]
    out["timing_table"] = [c.id for c in time_table]
    out["warm_s"] = rk.warm()
    if flags.get("copy"):
        out["copy_bandwidth"] = rk.copy_bandwidth()
        bounds = dict(bounds, copy_GBps=(out["copy_bandwidth"] or {}).get("GBps"))
    rk_bounds = dict(bounds)
    # the copy rate rank 0 measured (or the first world's), on every rank
    g = rk.gather([int((rk_bounds.get("copy_GBps") or 0) * 1000)])
    rk_bounds["copy_GBps"] = g[0][0] / 1000 or None
    now = time.time()
    reserve = 6 if flags.get("latency") else 2
    span = deadline - now - reserve
    out["correctness"] = rk.check_all(check_table, now + 0.45 * span)
    out["correctness"] += rk.bits_all(bits_table, now + 0.6 * span)
    out["correctness"].append(rk.deterministic_case(now + 0.65 * span))
    out["correctness"].append(rk.sequence(check_table, deadline - reserve))
    out["timing"] = rk.time_all(time_table, deadline - reserve, rk_bounds)
    import gpu_check_overlap
    ov_checks, out["overlap"] = gpu_check_overlap.overlap_checks(rk, deadline - reserve)
    out["correctness"] += ov_checks
    if flags.get("latency"):
        out["latency_8k"] = rk.latency(deadline)
        out["graph_8k"] = rk.graph_replay(deadline + 5)
        if out["graph_8k"].get("applicable", True):
            out["correctness"].append(out["graph_8k"])
    out["bounds"] = rk_bounds
    comm.barrier()
    return out if comm.rank == 0 else None


# =============================================================================================
# parent side: preflight

_PROBE = r"""
import json, os, sys, ctypes
res = {}
try:
    lib = ctypes.CDLL("libcuda.so.1")
    v = ctypes.c_int(0)
    if lib.cuInit(0) == 0 and lib.cuDriverGetVersion(ctypes.byref(v)) == 0:
        res["driver_cuda"] = f"{v.value // 1000}.{v.value % 1000 // 10}"
except OSError as e:
    res["driver_cuda_error"] = str(e)
import torch
res["torch_cuda"] = torch.version.cuda
res["cuda_available"] = torch.cuda.is_available()
if res["cuda_available"]:
    n = torch.cuda.device_count()
    res["device_count"] = n
    res["devices"] = []
    for i in range(n):
        p = torch.cuda.get_device_properties(i)
        res["devices"].append(dict(name=p.name, capability=f"{p.major}.{p.minor}",
                                   sm_count=p.multi_processor_count,
                                   memory_GiB=round(p.total_memory / 2**30, 1)))
    res["peer_access"] = [[i == j or torch.cuda.can_device_access_peer(i, j)
                           for j in range(n)] for i in range(n)]
    try:
        import triton, triton.language as tl
        @triton.jit
        def _k(x, n, B: tl.constexpr):
            o = tl.program_id(0) * B + tl.arange(0, B)
            tl.store(x + o, tl.load(x + o, mask=o < n) + 1, mask=o < n)
        x = torch.zeros(1000, device="cuda:0")
        _k[(4,)](x, 1000, B=256)
        torch.cuda.synchronize()
        res["triton_smoke"] = "ok" if bool((x == 1).all()) else "wrong result"
    except Exception as e:
        res["triton_smoke"] = f"{type(e).__name__}: {str(e)[:400]}"
    if n >= 2 and res["peer_access"][0][1]:
        a = torch.ones(64 << 18, device="cuda:0"); b = torch.empty(64 << 18, device="cuda:1")
        b.copy_(a); torch.cuda.synchronize()
        s = torch.cuda.Event(enable_timing=True); e = torch.cuda.Event(enable_timing=True)
        s.record()
        for _ in range(10):
            b.copy_(a)
        e.record(); e.synchronize()
        res["peer_copy_GBps"] = 10 * a.numel() * 4 / (s.elapsed_time(e) / 1e3) / 1e9
print(json.dumps(res))
"""


def _run(cmd, timeout=20):
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
        return r.returncode, r.stdout, r.stderr
    except (OSError, subprocess.TimeoutExpired) as e:
        return None, "", f"{type(e).__name__}: {e}"


def _ptxas() -> dict:
    try:
        import triton.backends.nvidia as nv
    except Exception as e:  # noqa: BLE001
        return dict(error=f"triton.backends.nvidia: {type(e).__name__}: {e}")
    path = os.environ.get("TRITON_PTXAS_PATH") or os.path.join(os.path.dirname(nv.__file__),
                                                                "bin", "ptxas")
    rc, out, err = _run([path, "--version"])
    m = re.search(r"release (\d+)\.(\d+)", out or "")
    return dict(path=path, version=f"{m.group(1)}.{m.group(2)}" if m else None,
                raw=(out or err).strip().splitlines()[-1:] if (out or err) else None)


def _smi() -> dict:
    q = ("name,driver_version,pci.bus_id,memory.total,clocks.sm,clocks.mem,clocks.max.sm,"
         "clocks.max.mem,power.draw,power.limit,temperature.gpu,persistence_mode,compute_mode,"
         "mig.mode.current")
    rc, out, err = _run(["nvidia-smi", f"--query-gpu={q}", "--format=csv,noheader"])
    if rc != 0 or not out.strip():
        return dict(error=f"nvidia-smi: {(err or 'no output').strip()[:200]}")
    gpus = [dict(zip(q.split(","), [v.strip() for v in line.split(",")]))
            for line in out.strip().splitlines()]
    res = dict(gpus=gpus)
    rc, out, _ = _run(["nvidia-smi"])
    m = re.search(r"CUDA Version:\s*([\d.]+)", out or "")
    res["cuda_version"] = m.group(1) if m else None
    rc, out, _ = _run(["nvidia-smi", "nvlink", "-s", "-i", "0"])
    speeds = [float(x) for x in re.findall(r"Link \d+: ([\d.]+) GB/s", out or "")]
    res["nvlink_links"] = len(speeds)
    res["nvlink_GBps"] = sum(speeds) or None
    return res


def _mps() -> dict:
    rc, _, _ = _run(["pgrep", "-f", "nvidia-cuda-mps-control"], timeout=5)
    pipe = os.environ.get("CUDA_MPS_PIPE_DIRECTORY", "/tmp/nvidia-mps")
    return dict(daemon=rc == 0, pipe_dir=pipe, pipe=os.path.exists(os.path.join(pipe, "control")))


def _ver(s):
    try:
        return tuple(int(x) for x in s.split(".")[:2])
    except (AttributeError, ValueError):
        return None


def preflight(interpret: bool) -> dict:
    """What this machine is, and whether it can run the check: ``verdict`` is ``ok`` or
    ``CANNOT RUN: reasons``; ``warnings`` lists what may distort the numbers."""
    if interpret:
        return dict(verdict="ok", summary="no GPU (interpret mode)", warnings=[], problems=[])
    pf = dict(ptxas=_ptxas(), nvidia_smi=_smi(), mps=_mps())
    # from a file: Triton before 3.9 refuses @jit functions defined in `python -c` code
    with tempfile.TemporaryDirectory() as tmp:
        probe_py = os.path.join(tmp, "gpu_check_probe.py")
        with open(probe_py, "w") as f:
            f.write(_PROBE)
        rc, out, err = _run([sys.executable, probe_py], timeout=180)
    try:
        pf["probe"] = json.loads(out.strip().splitlines()[-1])
    except (ValueError, IndexError):
        pf["probe"] = dict(error=f"probe failed (rc {rc}): {err.strip()[-600:]}")
    probs, warns = [], []
    probe = pf["probe"]
    if not probe.get("cuda_available"):
        probs.append(f"torch sees no CUDA device ({probe.get('error') or 'is_available False'})")
    drv = _ver(probe.get("driver_cuda") or pf["nvidia_smi"].get("cuda_version"))
    px = _ver(pf["ptxas"].get("version"))
    if px is None:
        probs.append(f"Triton's ptxas did not answer --version ({pf['ptxas']})")
    elif drv is None:
        warns.append("CUDA driver version unknown")
    elif px[0] > drv[0]:
        probs.append(f"Triton's ptxas is CUDA {px[0]}.{px[1]} but the driver supports CUDA "
                     f"{drv[0]}.{drv[1]}: kernels it builds will not load (set "
                     f"TRITON_PTXAS_PATH to a ptxas <= the driver's CUDA)")
    elif px > drv:
        warns.append(f"ptxas CUDA {px[0]}.{px[1]} newer than the driver's {drv[0]}.{drv[1]}")
    smoke = probe.get("triton_smoke")
    if probe.get("cuda_available") and smoke != "ok":
        probs.append(f"a tiny Triton kernel did not run: {smoke}")
    gpus = pf["nvidia_smi"].get("gpus") or []
    for i, g in enumerate(gpus):
        cm, mig = g.get("compute_mode", ""), g.get("mig.mode.current", "")
        if cm == "Prohibited":
            probs.append(f"GPU {i} compute mode Prohibited")
        elif cm.startswith("Exclusive") and not pf["mps"]["daemon"]:
            probs.append(f"GPU {i} compute mode {cm} without MPS: several rank processes "
                         f"cannot share it")
        if mig == "Enabled":
            probs.append(f"GPU {i} has MIG enabled: CUDA IPC between processes is not "
                         f"supported on MIG instances")
    if not pf["mps"]["daemon"]:
        warns.append("no MPS: rank processes sharing a GPU time-slice it (multi-rank timings "
                     "on one GPU include that scheduling)")
    n = probe.get("device_count") or 0
    pa = probe.get("peer_access") or []
    pf["multi_gpu"] = n >= 2 and all(all(row[:2]) for row in pa[:2])
    if n >= 2 and not pf["multi_gpu"]:
        warns.append("GPUs 0 and 1 have no peer access: no 2-GPU world")
    pf.update(problems=probs, warnings=warns,
              verdict="ok" if not probs else "CANNOT RUN: " + "; ".join(probs),
              summary=(f"{n} GPU(s) {', '.join(d['name'] for d in probe.get('devices', []))}, "
                       f"driver CUDA {probe.get('driver_cuda')}, ptxas "
                       f"{pf['ptxas'].get('version')}, MPS "
                       f"{'on' if pf['mps']['daemon'] else 'off'}"))
    return pf


# =============================================================================================
# parent side: worlds

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
    return env


def run_world(w, device, cfg, budget_s, partial_dir, flags, bounds, rank_setup=None):
    """Run the rank task on a fresh group of w ranks with a watchdog; returns (summary, status)."""
    import tilecomm

    partial = os.path.join(partial_dir, f"w{w}_{device.replace(':', '')}.jsonl")
    deadline = time.time() + budget_s
    group = tilecomm.RankGroup(w, timeout=60, heap_bytes=64 << 20, scratch_bytes=1 << 20)
    killed = threading.Event()

    def watchdog():
        killed.set()
        group.stop()

    timer = threading.Timer(budget_s + 20, watchdog)     # ranks check the deadline; this is
    timer.daemon = True                                   # for a rank stuck past it
    status, summary = "ok", None
    try:
        group.start()
        timer.start()
        res = group.run(rank_task, cfg, device, partial, deadline, flags, bounds, rank_setup)
        summary = res[0]
        if summary and summary.get("fatal"):
            status = "failed: " + summary["fatal"]
    except BaseException as e:  # noqa: BLE001 - one world failing is reported
        status = ("killed by the watchdog" if killed.is_set() else "failed") + \
            f": {type(e).__name__}: {str(e)[:500]}"
    finally:
        timer.cancel()
        group.stop()
    if summary is None or summary.get("fatal"):      # what rank 0 logged before the failure
        summary = dict(summary or {}, world=w, correctness=[], timing=[])
        if os.path.exists(partial):
            with open(partial) as f:
                for line in f:
                    rec = json.loads(line)
                    phase = rec.pop("phase")
                    key = {"check": "correctness", "overlap": "overlap"}.get(phase, "timing")
                    summary.setdefault(key, []).append(rec)
    return summary, status


def _fmt(v, nd=1):
    return "-" if v is None else (f"{v:.{nd}f}" if isinstance(v, float) else str(v))


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
            k["errors"].append(f"{c['case']}: {c['error']}")
    for k in res["kernels"]:
        e = per.setdefault(k, dict(ok=False, worlds={}, errors=["no correctness case ran"]))
        if not any(v["run"] + v["skipped"] for v in e["worlds"].values()):
            e["ok"] = False     # (only skipped cases: INCOMPLETE, not FAIL)
    res["correctness_summary"] = dict(sorted(per.items()))
    res["skipped_cases"] = sum(w["skipped"] for k in per.values() for w in k["worlds"].values())
    res["skipped_cases"] += sum(1 for t in res["timing"]
                                if str(t.get("error", "")).startswith("skipped"))
    res["skipped_cases"] += sum(1 for s in res["worlds"].values() if s.startswith("skipped"))
    res["skipped_cases"] += sum(1 for t in res.get("overlap", []) for e in t["errors"].values()
                                if e.startswith("skipped"))
    timing_failed = [t["case"] for t in res["timing"]
                     if t.get("error") and not str(t["error"]).startswith("skipped")]
    # the fused ops' own timings (a PyTorch baseline that cannot run is not a failure)
    timing_failed += [f"{t['case']} {lab}" for t in res.get("overlap", [])
                      for lab, e in t["errors"].items()
                      if lab.startswith(("fused", "unfused")) and not e.startswith("skipped")]
    res["timing_failed"] = timing_failed
    ran = [s for s in res["worlds"].values() if not s.startswith("skipped")]
    res["all_correct"] = bool(per) and all(v["ok"] for v in per.values()) and \
        bool(ran) and all(s == "ok" for s in ran) and not timing_failed
    if not res["all_correct"]:
        res["verdict"] = "FAIL"
    elif res["skipped_cases"]:
        res["verdict"] = "INCOMPLETE"
    else:
        res["verdict"] = "PASS"


def text_report(res) -> str:
    pf = res["preflight"]
    lines = [f"gpu_check ({res['env']['mode']}), {res['wall_s']:.0f} s, "
             f"torch {res['env']['torch']}, triton {res['env']['triton']}",
             f"preflight: {pf['summary']}: {pf['verdict']}"]
    for wmsg in pf.get("warnings", []):
        lines.append(f"  warning: {wmsg}")
    for g in (pf.get("nvidia_smi") or {}).get("gpus", []):
        lines.append("GPU: " + ", ".join(f"{k}={v}" for k, v in g.items()))
    cb = res.get("copy_bandwidth")
    if cb:
        lines.append(f"device copy: {cb['bytes'] >> 20} MiB in {cb['us']:.1f} us = "
                     f"{cb['GBps']:.1f} GB/s copied ({cb['read_plus_write_GBps']:.1f} GB/s "
                     f"read+write)")
    if pf.get("verdict") != "ok":
        lines.append("")
        lines.append(f"RESULT: {pf['verdict']}")
        return "\n".join(lines)
    lines.append("")
    lines.append("worlds: " + ", ".join(f"{w}: {s}" for w, s in res["worlds"].items()))
    lines.append(f"case table: {len(res['table'])} correctness rows, "
                 f"{len(res['timing_table'])} timing rows (ids as tilecomm bench's)")
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
    lines.append("timing, float32 sum (us: slowest rank, median round of back-to-back calls; "
                 "bound: NVLink between GPUs, else ranks-on-the-GPU x bytes a rank writes / "
                 "device copy rate):")
    lines.append(f"  {'case':44s} {'us':>10s} {'busbw GB/s':>10s} {'bound us':>10s} "
                 f"{'% bound':>8s}")
    for t in res["timing"]:
        if t.get("error"):
            lines.append(f"  {t['case']:44s}  {t['error']}")
            continue
        frac = t.get("frac_of_bound")
        lines.append(f"  {t['case']:44s} {t['us']:10.1f} {t['busbw_GBps']:10.2f} "
                     f"{_fmt(t.get('bound_us')):>10s} "
                     f"{(f'{100 * frac:.0f}%' if frac else '-'):>8s}")
    import gpu_check_overlap
    lines += gpu_check_overlap.text_lines(res.get("overlap", []))
    lat = res.get("latency_8k")
    if lat:
        lines.append("")
        lines.append(f"8 KB latency, {lat['world']} ranks (us per call, slowest rank, "
                     f"{lat['iters']} calls):")
        for k, v in lat["us_slowest_rank"].items():
            lines.append(f"  {k:48s} {_fmt(v)}")
        g = res.get("graph_8k") or {}
        gv = g.get("us_per_replay_slowest_rank") or g.get("error") or \
            ("ok" if g.get("ok") else "-")
        lines.append(f"  {'all_reduce in a CUDA graph (replay)':48s} {_fmt(gv)}")
    lines.append("")
    v = res["verdict"]
    why = {"PASS": "all kernels correct",
           "FAIL": "failures: " + ", ".join(k for k, p in res["correctness_summary"].items()
                                            if not p["ok"]) +
                   (f"; timing failed: {', '.join(res['timing_failed'][:4])}"
                    if res["timing_failed"] else "") +
                   "; worlds: " + ", ".join(f"{w} {s}" for w, s in res["worlds"].items()
                                            if s != "ok"),
           "INCOMPLETE": f"no failure, but {res['skipped_cases']} cases skipped "
                         f"(budget spent)"}[v]
    lines.append(f"RESULT: {v}: {why} ({len(res['kernels'])} kernels: "
                 f"{', '.join(res['kernels'])})")
    return "\n".join(lines)


def run_check(cfg: dict, out_dir: str, rank_setup=None, log=print) -> tuple[dict, int]:
    """The whole check (preflight, every world), results written to ``out_dir``; returns
    ``(results, exit status)``. ``rank_setup(comm)`` runs first on every rank (tests use it
    to register a deliberately broken kernel)."""
    t0 = time.time()
    interpret = cfg["interpret"]
    if interpret:      # before any triton import here (ranks fork from this process)
        os.environ["TRITON_INTERPRET"] = "1"
    os.makedirs(out_dir, exist_ok=True)
    res = dict(env=environment(interpret), config=cfg, worlds={}, kernels=[], table=[],
               bits_table=[], timing_table=[], correctness=[], timing=[], overlap=[],
               copy_bandwidth=None,
               latency_8k=None, graph_8k=None)
    pf = res["preflight"] = preflight(interpret)
    res["env"]["nvidia_smi"] = (pf.get("nvidia_smi") or {}).get("gpus") or \
        ("no GPU (interpret mode)" if interpret else (pf.get("nvidia_smi") or {}).get("error"))
    res["env"]["mps_running"] = (pf.get("mps") or {}).get("daemon")
    log(f"[gpu_check] preflight: {pf['summary']}: {pf['verdict']}")
    if pf["verdict"] != "ok":
        res["wall_s"] = time.time() - t0
        res["verdict"], res["all_correct"], res["skipped_cases"] = "CANNOT RUN", False, 0
        return _write(res, out_dir, log), EXIT_CANNOT_RUN
    worlds = [list(x) for x in cfg["worlds"]]
    if not interpret and pf.get("multi_gpu") and not cfg.get("worlds_given"):
        worlds.append([2, "cuda"])                      # rank r on cuda:r: the 2-GPU world
    probe = pf.get("probe") or {}
    bounds = dict(device_count=probe.get("device_count", 1),
                  nvlink_GBps=(pf.get("nvidia_smi") or {}).get("nvlink_GBps"),
                  peer_copy_GBps=probe.get("peer_copy_GBps"))
    budget = cfg["budget"]
    biggest = max(cfg["check_sizes"] + cfg["time_sizes"])
    # every kernel keeps its own scratch (two halves, grown to its largest call): 256 MiB ran
    # out at 16 MiB calls on an H200 once the table had run, so a GiB or more per rank
    cfg.setdefault("device_heap_bytes", max(1 << 30, 32 * biggest + (256 << 20)))
    with tempfile.TemporaryDirectory(prefix="gpu_check_") as tmp:
        cfg["overlap_store"] = os.path.join(tmp, "torch_symm_store")   # PyTorch baseline
        for i, (w, device) in enumerate(worlds):
            key = str(w) if device in ("cpu", "cuda:0") else f"{w}@{device}"
            left = budget - (time.time() - t0)
            # bigger worlds get more; the first also pays for compiling the kernels
            per_world = left * (w + 4 + (4 if i == 0 else 0)) / \
                sum(x + 4 + (4 if j == 0 and i == 0 else 0) for j, (x, _) in
                    enumerate(worlds[i:]))
            if per_world < 5:
                res["worlds"][key] = "skipped: budget spent"
                continue
            log(f"[gpu_check] world {key} ({device}): {per_world:.0f} s budget")
            flags = dict(copy=(i == 0),
                         latency=(w == max(x for x, d in worlds if d == worlds[0][1])
                                  and device == worlds[0][1]))
            wb = dict(bounds, spread=(device == "cuda"),
                      copy_GBps=(res["copy_bandwidth"] or {}).get("GBps"))
            summary, status = run_world(w, device, cfg, per_world, tmp, flags, wb, rank_setup)
            res["worlds"][key] = status
            for k in summary.get("kernels", []):
                if k not in res["kernels"]:
                    res["kernels"].append(k)
            for name in ("table", "bits_table", "timing_table"):
                res[name] += [c for c in summary.get(name, []) if c not in res[name]]
            res["correctness"] += summary.get("correctness", [])
            res["timing"] += summary.get("timing", [])
            res["overlap"] += summary.get("overlap", [])
            for name in ("copy_bandwidth", "latency_8k", "graph_8k"):
                if summary.get(name):
                    res[name] = summary[name]
            res.setdefault("warm_s", {})[key] = summary.get("warm_s")
            if summary.get("traceback"):
                res.setdefault("tracebacks", {})[key] = summary["traceback"]
            log(f"[gpu_check] world {key}: {status}")
    res["wall_s"] = time.time() - t0
    summarize(res)
    code = {"PASS": EXIT_PASS, "FAIL": EXIT_FAIL, "INCOMPLETE": EXIT_INCOMPLETE}[res["verdict"]]
    return _write(res, out_dir, log), code


def _write(res, out_dir, log):
    res.setdefault("wall_s", 0.0)
    with open(os.path.join(out_dir, "gpu_check.json"), "w") as f:
        json.dump(res, f, indent=1, default=str)
    text = text_report(res) if res.get("verdict") != "CANNOT RUN" else _cannot(res)
    with open(os.path.join(out_dir, "gpu_check.txt"), "w") as f:
        f.write(text + "\n")
    log(text)
    return res


def _cannot(res):
    res.setdefault("correctness_summary", {})
    return text_report(res)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--interpret", action="store_true",
                   help="CPU dry run: Triton interpreter, 2 CPU ranks, small sizes")
    p.add_argument("--worlds", default=None, help="comma-separated world sizes (2,4,8)")
    p.add_argument("--budget", type=float, default=None,
                   help="seconds for all worlds together (default 240 GPU, 600 interpret)")
    p.add_argument("--out", default=None, help="output folder (default $OUT or ./gpu_check_out)")
    p.add_argument("--kernels", default=None,
                   help="comma-separated collective/algo to run (default: every registered one)")
    p.add_argument("--device-timeout", type=float, default=None,
                   help="seconds a device wait polls before giving up (default 5)")
    a = p.parse_args(argv)
    cfg = _config(a.interpret)
    if a.worlds:
        dev = "cpu" if a.interpret else "cuda:0"
        cfg["worlds"] = [[int(x), dev] for x in a.worlds.split(",")]
        cfg["worlds_given"] = True
    cfg["kernels"] = a.kernels.split(",") if a.kernels else None
    if a.budget:
        cfg["budget"] = a.budget
    cfg["device_timeout"] = a.device_timeout or cfg["device_timeout"]
    os.environ["TILECOMM_DEVICE_TIMEOUT"] = str(cfg["device_timeout"])
    out_dir = a.out or os.environ.get("OUT") or "./gpu_check_out"
    _, code = run_check(cfg, out_dir, log=lambda s: print(s, flush=True))
    return code


if __name__ == "__main__":
    sys.exit(main())

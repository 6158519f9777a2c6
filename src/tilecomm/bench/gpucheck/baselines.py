"""Baselines measured in the same run as tilecomm, on the same GPU and the same ranks.

* **NCCL** through ``torch.distributed``, several ranks on one GPU: NCCL refused that before
  2.30 ("Duplicate GPU detected"); from 2.30 ``NCCL_MULTI_RANK_GPU_ENABLE=1`` (set for every
  rank by the check) allows it. The version is read first (``torch.cuda.nccl.version()``) and
  an older NCCL is reported as such, not tried. The calls are ``bench.cases``' baselines on a
  NCCL group over the world.
* **PyTorch SymmetricMemory** one-shot and two-shot all_reduce
  (``torch.ops.symm_mem.one_shot_all_reduce`` / ``two_shot_all_reduce_``) on
  ``symm_mem.empty`` tensors, with ``TORCH_SYMM_MEM_ALLOW_OVERLAPPING_DEVICES=1`` (several
  ranks on one device).
* **the device copy rate** (every rank copying at once: the ranks' bytes copied over the
  slowest rank's time): the bound of the data-movement rows.

Every figure is *same device*: it measures the kernels, their signalling and one HBM, not
NVLink. A baseline that is missing or fails says why and never fails the check (it is not the
code under test).
"""

from __future__ import annotations

import os
from datetime import timedelta

import torch

#: NCCL from which several ranks may share one GPU (NCCL_MULTI_RANK_GPU_ENABLE)
NCCL_MULTI_RANK = (2, 30)

#: environment every rank gets before CUDA/NCCL start (harmless where unused)
RANK_ENV = {"NCCL_MULTI_RANK_GPU_ENABLE": "1", "TORCH_SYMM_MEM_ALLOW_OVERLAPPING_DEVICES": "1"}


def nccl_version() -> tuple[int, ...] | None:
    try:
        v = torch.cuda.nccl.version()
    except Exception:  # noqa: BLE001 - a CPU build of torch
        return None
    return tuple(v) if isinstance(v, tuple) else (v // 10000, v // 100 % 100, v % 100)


class Baselines:
    """The baselines of one world (collective set-up on every rank; ``store_path`` a file for
    torch.distributed's rendezvous, fresh per world)."""

    def __init__(self, rk, store_path: str):
        import torch.distributed as dist

        self.rk, self.dist = rk, dist
        self.nccl = None                    # the NCCL group, when it runs
        self.nccl_reason = ""
        self.symm_reason = ""
        self.symm_group = None
        self._symm_buf = None               # one rendezvoused buffer, grown to the largest
        if not rk.cuda:
            self.nccl_reason = self.symm_reason = "n/a: needs CUDA tensors (interpret mode)"
            return
        err = None
        try:
            if not dist.is_initialized():
                store = dist.FileStore(store_path, rk.w)
                dist.init_process_group("gloo", store=store, rank=rk.r, world_size=rk.w,
                                        timeout=timedelta(seconds=60))
        except Exception as e:  # noqa: BLE001 - every baseline then says why it is missing
            err = f"{type(e).__name__}: {str(e)[:300]}"
        if not rk.all_ok(err is None):
            self.nccl_reason = self.symm_reason = \
                f"unavailable: torch.distributed did not start: {rk.failed_elsewhere(err)}"
            return
        self._nccl()
        self._symm()

    def _nccl(self) -> None:
        rk, dist = self.rk, self.dist
        v = nccl_version()
        if v is None:
            self.nccl_reason = "n/a: this torch has no NCCL"
        elif v[:2] < NCCL_MULTI_RANK and rk.w > 1:
            self.nccl_reason = (f"n/a: NCCL {'.'.join(map(str, v))} refuses several ranks on "
                                f"one GPU (NCCL_MULTI_RANK_GPU_ENABLE needs "
                                f"{'.'.join(map(str, NCCL_MULTI_RANK))} or newer)")
        else:
            err = None
            try:
                g = dist.new_group(backend="nccl", timeout=timedelta(seconds=30))
                t = torch.ones(4, device=rk.dev)
                dist.all_reduce(t, group=g)
                torch.cuda.synchronize(rk.dev)
                if float(t[0]) != rk.w:
                    err = f"a NCCL all_reduce of ones gave {float(t[0])}, not {rk.w}"
            except Exception as e:  # noqa: BLE001 - reported as the baseline's reason
                err = f"{type(e).__name__}: {str(e)[:300]}"
            err = rk.failed_elsewhere(err) if not rk.all_ok(err is None) else None
            if err is None:
                self.nccl = g
            else:
                self.nccl_reason = f"unavailable: {err}"

    def _symm(self) -> None:
        rk, dist = self.rk, self.dist
        err = None
        try:
            from torch.distributed import _symmetric_memory as symm
            ops = getattr(torch.ops, "symm_mem", None)
            if ops is None or not hasattr(ops, "one_shot_all_reduce") \
                    or not hasattr(ops, "two_shot_all_reduce_"):
                err = f"n/a: torch {torch.__version__} has no symm_mem one/two-shot all_reduce"
            else:
                name = dist.group.WORLD.group_name
                if hasattr(symm, "enable_symm_mem_for_group"):
                    symm.enable_symm_mem_for_group(name)
                self._symm_mod, self.symm_group = symm, name
        except Exception as e:  # noqa: BLE001
            err = f"unavailable: {type(e).__name__}: {str(e)[:300]}"
        if not rk.all_ok(err is None):
            self.symm_reason = rk.failed_elsewhere(err)
            self.symm_group = None

    # ---- calls --------------------------------------------------------------------------
    def nccl_call(self, case):
        """``fn()`` running ``case``'s operation through NCCL on ordinary CUDA tensors (the
        buffers ``fn.bufs``), or the reason string."""
        if self.nccl is None:
            return self.nccl_reason
        from ..cases import CASES, Buffers
        c = CASES[case.op]
        _, in_n, out_n = self.rk.runner.case_counts(case)
        dt = getattr(torch, case.dtype)
        try:
            b = Buffers(torch.ones(in_n, dtype=dt, device=self.rk.dev),
                        torch.zeros(out_n, dtype=dt, device=self.rk.dev) if out_n else None)
        except Exception as e:  # noqa: BLE001 - e.g. out of memory: the row says so
            return f"{type(e).__name__}: {str(e)[:300]}"

        def fn():
            c.baseline(self.dist, b, group=self.nccl)
        fn.bufs = b
        return fn

    def symm_call(self, algo: str, count: int, dtype: torch.dtype, most: int | None = None):
        """``fn()`` of PyTorch's symmetric-memory ``one_shot`` / ``two_shot`` all_reduce of
        ``count`` elements, on a view of one symmetric buffer of ``most`` (default ``count``)
        elements allocated and rendezvoused once (collective; a fresh buffer per size would
        rendezvous every time, and a reused block could differ between ranks), or the reason
        string. ``fn.bufs`` is the view."""
        if self.symm_group is None:
            return self.symm_reason
        err = None
        try:
            buf = self._symm_buf
            if buf is None or buf.numel() < count or buf.dtype != dtype:
                buf = self._symm_mod.empty(max(count, most or count), dtype=dtype,
                                           device=self.rk.dev)
                self._symm_mod.rendezvous(buf, self.symm_group)
                self._symm_buf = buf
            t = buf[:count]
            name = self.symm_group
            if algo == "one_shot":
                op = torch.ops.symm_mem.one_shot_all_reduce    # returns a new tensor
            else:
                op = torch.ops.symm_mem.two_shot_all_reduce_   # in place

            def fn():
                op(t, "sum", name)
            fn.bufs = t
        except Exception as e:  # noqa: BLE001
            err = f"{type(e).__name__}: {str(e)[:300]}"
        if not self.rk.all_ok(err is None):
            return f"unavailable: {self.rk.failed_elsewhere(err)}"
        return fn  # noqa: F821 - defined whenever err is None


def copy_rate(rk, nbytes: int) -> dict | None:
    """The device copy rate with every rank copying ``nbytes`` at once (after a barrier; under
    MPS each rank has only its share of the SMs, so one rank alone would understate what the
    ranks together get from the one HBM): all ranks' bytes copied over the slowest rank's time
    (each byte read once and written once), median of 5 rounds of 5 copies; the same on every
    rank."""
    n = nbytes // 4
    a = torch.randn(n, device=rk.dev)
    b = torch.empty_like(a)
    b.copy_(a)
    rk.sync()
    clock = rk.runner.Clock(rk.dev)
    secs = rk.runner.time_rounds(rk.comm.barrier, lambda: b.copy_(a), 1, 5, 5, clock=clock)
    a = b = None            # noqa: F841 - the copy's buffers go before the sweep
    per = rk.gather_times(secs, 5)
    if per is None:
        return None
    t = rk.slowest_median(per)
    total = rk.w * n * 4
    return dict(bytes_per_rank=n * 4, ranks=rk.w, us=t * 1e6, GBps=total / t / 1e9,
                read_plus_write_GBps=2 * total / t / 1e9)


def rank_env() -> dict[str, str]:
    """What every rank's environment gets for the baselines (before CUDA starts)."""
    return {k: os.environ.get(k, v) for k, v in RANK_ENV.items()}

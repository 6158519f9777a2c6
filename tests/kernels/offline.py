"""Launchers without a GPU and without ranks: a real ``KernelContext`` on a stand-in heap whose
tensors are CPU tensors, for tests that only need what a launcher passes to its kernel (the
launch's specialization, the code Triton compiles for it) under
``tilecomm.device.compile_check.record_launches``. Nothing is launched: no kernel runs.

Import only in processes without TRITON_INTERPRET (the kernels must be JIT functions).
"""

from __future__ import annotations

import torch

from tilecomm.backends.base import CollectiveCall
from tilecomm.device.handle import make_handle
from tilecomm.types import ReduceOp, lookup_dtype

#: bytes every stand-in allocation is aligned to (the CUDA heap and shm segments give 256)
ALIGN = 256


def aligned(numel: int, dtype: torch.dtype, offset_bytes: int = 0) -> torch.Tensor:
    """A zero CPU tensor whose data starts ``offset_bytes`` past a 256-byte boundary."""
    isz = torch.empty((), dtype=dtype).element_size()
    raw = torch.zeros(numel * isz + ALIGN + offset_bytes, dtype=torch.uint8)
    skip = (-raw.data_ptr()) % ALIGN + offset_bytes
    return raw[skip:skip + numel * isz].view(dtype)


class FakeHeap:
    """Enough of a ``DeviceHeap`` for ``KernelContext``: 256-byte aligned CPU allocations."""

    def __init__(self, rank: int, world: int):
        self.rank, self.world_size = rank, world
        self.device = torch.device("cpu")
        self.timeout_ns = 10 * 10**9
        self.handle = make_handle(rank, [r << 30 for r in range(world)], self.timeout_ns)
        self._epoch = 0

    def next_epoch(self) -> int:
        self._epoch += 1
        return self._epoch

    def alloc(self, shape, dtype=torch.float32):
        n = shape if isinstance(shape, int) else int(torch.tensor(shape).prod())
        return aligned(n, dtype)

    def signal_pad(self, slots, dtype=torch.int64):
        return self.alloc(slots, dtype)

    def barrier(self):
        pass

    def check(self, kernel):
        pass


class FakeHost:
    """The host communicator KernelContext asks for its CTA budget (every rank: 132 SMs, its
    own GPU, no MPS share, no TILECOMM_GPU_CTAS)."""

    def __init__(self, rank: int, world: int):
        self.rank, self.world = rank, world

    def all_gather(self, t):
        return torch.cat([torch.tensor([132, r, 100, 0], dtype=torch.int64)
                          for r in range(self.world)])


def context(rank: int, world: int, epoch: int):
    """A GPU-configured KernelContext (block 1024, 264 programs) at ``epoch``."""
    from tilecomm.backends.triton.context import KernelContext

    ctx = KernelContext(FakeHeap(rank, world), FakeHost(rank, world), interpret=False)
    ctx.heap._epoch = epoch - 1
    ctx.begin(zero_copy=False)
    return ctx


def call(collective: str, algo: str, dtype: torch.dtype, count: int, world: int,
         op: str | None = None, root: int = 0, offset_bytes: int = 0) -> CollectiveCall:
    """A CollectiveCall with aligned CPU buffers (``offset_bytes`` shifts the user tensors)."""
    def t(n):
        return aligned(n, dtype, offset_bytes)

    if collective in ("all_reduce", "broadcast"):
        bufs = {"buf": t(count)}
    elif collective == "all_gather":
        bufs = {"in": t(count), "out": t(world * count)}
    elif collective == "reduce_scatter":
        bufs = {"in": t(count), "out": t(count // world)}
    else:
        bufs = {"in": t(count), "out": t(count)}
    red = collective in ("all_reduce", "reduce_scatter")
    return CollectiveCall(collective, algo, lookup_dtype(dtype), count, bufs,
                          op=ReduceOp(op or "sum") if red else None, root=root)


def launch(collective: str, algo: str, ctx, c: CollectiveCall) -> None:
    from tilecomm.backends.triton import registry

    registry.load()[(collective, algo)].launch(ctx, c)

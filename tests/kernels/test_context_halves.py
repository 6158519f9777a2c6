"""KernelContext's parity halves never overlap between consecutive calls of different sizes.

A rank may start call k+1 while a slow peer still reads what it staged in call k; the two
calls use opposite halves, which must be disjoint whatever their sizes.
"""

from __future__ import annotations

import torch

from tilecomm.backends.triton.context import KernelContext


class _FakeHeap:
    """Just what scratch()/half() use: a device, rank, allocation and a barrier."""

    rank, world_size, device = 0, 1, torch.device("cpu")

    def __init__(self):
        self.barriers = 0

    def alloc(self, n, dtype):
        return torch.zeros(n, dtype=dtype)

    def barrier(self):
        self.barriers += 1


def _span(t: torch.Tensor) -> range:
    lo = t.data_ptr()
    return range(lo, lo + t.numel() * t.element_size())


def test_halves_of_consecutive_calls_are_disjoint():
    ctx = KernelContext(_FakeHeap(), host=None, interpret=True)
    sizes = [1000, 10, 3000, 7, 7, 2500, 1]
    prev = None
    for epoch, n in enumerate(sizes, start=2):
        ctx.epoch = epoch
        cur = ctx.half("stage", n, torch.float32)
        assert cur.numel() == n
        if prev is not None and ctx._scratch["stage"].data_ptr() == prev[1]:
            a, b = _span(prev[0]), _span(cur)
            assert not set(a) & set(b), (epoch, n)
        prev = (cur, ctx._scratch["stage"].data_ptr())


def test_growing_the_halves_waits_for_every_rank():
    heap = _FakeHeap()
    ctx = KernelContext(heap, host=None, interpret=True)
    ctx.epoch = 1
    ctx.half("stage", 10, torch.float32)
    assert heap.barriers == 0                 # first allocation: nothing to retire
    ctx.epoch = 2
    ctx.half("stage", 100_000, torch.float32)
    assert heap.barriers == 1                 # the old buffer is dropped only after a barrier

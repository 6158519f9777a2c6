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


def test_programs_of_a_two_dimensional_grid_stay_within_the_cap():
    ctx = KernelContext(_FakeHeap(), host=None, interpret=True)
    ctx.max_programs, ctx.sharing = 16, 8
    assert ctx.programs(10**9) == 16
    assert ctx.programs(10**9, width=8) == 2          # (2, 8) grid: 16 CTAs
    assert ctx.programs(10**9, width=32) == 1
    ctx.sharing = 1                                   # own GPU: the same cap (co-residency)
    assert ctx.programs(10**9, width=8) == 2


def test_buffers_a_captured_graph_uses_are_never_freed(monkeypatch):
    """After a CUDA graph captured a call (advance() while capturing), growing scratch or the
    signal pad (which frees the old buffer) is refused with a message, not done under the
    graph's feet. (No GPU here: capturing() is what torch reports during a capture.)"""
    import types

    import pytest as _pytest

    from tilecomm.backends.triton.context import KernelContext
    from tilecomm.errors import CommError

    ctx = KernelContext.__new__(KernelContext)
    ctx.graph_captured, ctx.exact_upto, ctx.epoch = False, None, 7
    ctx._epoch_dev = torch.zeros(1, dtype=torch.int64)
    ctx.heap = types.SimpleNamespace(barrier=lambda: None, free=lambda t: None,
                                     next_epoch=lambda: 8)
    ctx._retire(torch.empty(1))                       # eager: fine
    monkeypatch.setattr(KernelContext, "capturing", lambda self: True)
    ctx.advance()
    assert ctx.graph_captured and ctx.epoch == 7      # the host count waits for replays
    with _pytest.raises(CommError, match="Warm up with the largest sizes"):
        ctx._retire(torch.empty(1))

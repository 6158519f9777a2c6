"""tilecomm's own paths as baselines of a collective (``tilecomm bench OP --vs python|staged``).

The CPU executor runs a plan through its native runner, and lets peers read large ordinary
tensors in place (single-copy reads, process_vm_readv). Each can be switched off on a live
communicator, so what it buys is measured in the same processes, interleaved round by round
with the default path (``benchmarks/native_vs_python.py`` and ``single_copy.py`` did this
with loops of their own):

* ``python``: the executor's Python path (the native runner off);
* ``staged``: every tensor staged through shared memory (single-copy reads off).

A variant's round switches the mode before its barrier, forgets the kept calls (they keep the
programs they were built with) and warms up, untimed; afterwards it switches back, forgets and
warms up again, so that tilecomm's own rounds always find the default path ready.
"""

from __future__ import annotations

from typing import Callable

VARIANTS = {"python": "tilecomm with the native runner off (the executor's Python path)",
            "staged": "tilecomm with single-copy reads off (every tensor staged)"}

#: untimed calls after each switch of the mode
WARM_CALLS = 3


def _executor(comm):
    return getattr(comm.host.backend, "executor", None)


def _single_copy_allowed(comm, ex) -> bool:
    """Every rank's start-up probe found process_vm_readv allowed (as ``tilecomm doctor``
    reads it; every rank has published its probe after a collective)."""
    from ..backends.cpu.cma import SINGLE_COPY_YES
    from ..heap.base import SegmentLayout
    return {int(ex.ch.slots[r][SegmentLayout.CMA])
            for r in range(comm.world_size)} == {SINGLE_COPY_YES}


def variant_method(comm, name: str, call: Callable, iters: int, warmup: int, *,
                   refill: Callable | None = None, chunk: int | None = None):
    """The timed method of ``call`` (one collective call on this rank's buffers) on the path
    ``name`` of :data:`VARIANTS`, or why it cannot run here (a string, alike on every rank).
    ``call`` must have run once on every rank before (the single-copy probe is read)."""
    ex = _executor(comm)
    if ex is None:
        return f"{name}: no CPU executor here (kernel path or simulated hosts)"
    if name == "python":
        if not ex.native:
            return "python: the native runner is off or not built (the default is Python)"
        attr, off = "native", False
    elif name == "staged":
        if not _single_copy_allowed(comm, ex):
            return "staged: single-copy reads are not allowed here: both paths stage"
        attr, off = "cma", False
    else:
        raise ValueError(f"--vs {name}: choose gloo, {', '.join(VARIANTS)}")
    default = getattr(ex, attr)

    def switch(value):
        def go():
            setattr(ex, attr, value)
            comm.forget_calls()
            for i in range(WARM_CALLS):
                if refill and i == 0:
                    refill()
                call()
        return go

    return lambda t: t.calls("call", call, iters, refill=refill, chunk=chunk, warmup=warmup,
                             setup=switch(off), teardown=switch(default))

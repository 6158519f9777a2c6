"""CPU backend: ranks are processes on one host, moving data through the shared-memory heap."""

from __future__ import annotations

import os

import numpy as np

from ...heap.base import SegmentLayout
from ...heap.shm import ShmHeap
from ...settings import settings
from ...types import DType
from ..base import Backend, CollectiveCall, PreparedCall
from . import cma
from .channel import Channel
from .cma import SINGLE_COPY_NO, SINGLE_COPY_OVERSUBSCRIBED, SINGLE_COPY_YES
from .executor import Executor
from .p2p import PointToPoint


class CpuBackend(Backend):
    """Collectives (schedule executor) and send/recv for CPU tensors over a :class:`ShmHeap`."""

    def __init__(self, heap: ShmHeap, *, timeout: float, spin: int, scratch_bytes: int):
        self.heap = heap
        self.rank, self.world_size = heap.rank, heap.world_size
        self.channel = Channel(heap, timeout, spin)
        self.executor = Executor(self.channel, heap, scratch_bytes)
        self.p2p = PointToPoint(self.channel, heap)

    def attach_debug(self, flight, tracer) -> None:
        self.channel.flight = flight
        self.channel.trace = self.executor.trace = tracer

    def run(self, call: CollectiveCall) -> None:
        self.executor.run(call)

    def prepare(self, call: CollectiveCall) -> PreparedCall:
        return PreparedCall(self, call, self.executor.run)

    def forget_calls(self) -> None:
        self.executor.forget_calls()

    def reject(self, collective: str, message: str) -> None:
        self.executor.reject(collective, message)

    def rendezvous(self, name: str, count: int, extra: int) -> list[int]:
        probe = name == "init" and settings().cma and cma.supported()
        if probe:
            cma.allow_peers()       # before any peer can probe this process
        out = self.executor.rendezvous(name, count, extra)
        if name == "init":
            self._probe_single_copy(probe)
        return out

    def _probe_single_copy(self, ok: bool) -> None:
        """Publish whether this rank can read every peer with process_vm_readv (each rank
        has posted its pid and segment address before "init"): collectives use it only when
        every rank can (Executor._single_copy). ``ok``: whether to try at all. With more
        ranks than CPUs it is not used: there (4 ranks on 2 cores) several readers of one
        buffer made broadcast 1.3x slower than staging (docs/benchmarks.md)."""
        ch = self.channel
        if ok and self.world_size > len(os.sched_getaffinity(0)):
            ch.me[SegmentLayout.CMA] = SINGLE_COPY_OVERSUBSCRIBED
            return
        for r in range(self.world_size):
            if not ok or r == self.rank:
                continue
            slots = ch.slots[r]
            expected = int(slots[SegmentLayout.PID]).to_bytes(8, "little", signed=True)
            ok = cma.probe(int(slots[SegmentLayout.PID]),
                           int(slots[SegmentLayout.SELF_ADDR]) + 8 * SegmentLayout.PID, expected)
        ch.me[SegmentLayout.CMA] = SINGLE_COPY_YES if ok else SINGLE_COPY_NO

    def send(self, data: np.ndarray, dtype: DType, numel: int, peer: int, tag: int = 0) -> None:
        self.p2p.send(data, dtype, numel, peer, tag)

    def recv(self, out: np.ndarray, dtype: DType, numel: int, peer: int, tag: int = 0) -> None:
        self.p2p.recv(out, dtype, numel, peer, tag)

    def probe(self, peer: int) -> bool:
        return self.p2p.probe(peer)

    def close(self) -> None:
        self.heap.close()


__all__ = ["CpuBackend"]

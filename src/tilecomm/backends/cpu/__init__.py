"""CPU backend: ranks are processes on one host, moving data through the shared-memory heap."""

from __future__ import annotations

import numpy as np

from ...heap.shm import ShmHeap
from ...types import DType
from ..base import Backend, CollectiveCall
from .channel import Channel
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

    def reject(self, collective: str, message: str) -> None:
        self.executor.reject(collective, message)

    def rendezvous(self, name: str, count: int, extra: int) -> list[int]:
        return self.executor.rendezvous(name, count, extra)

    def send(self, data: np.ndarray, dtype: DType, numel: int, peer: int, tag: int = 0) -> None:
        self.p2p.send(data, dtype, numel, peer, tag)

    def recv(self, out: np.ndarray, dtype: DType, numel: int, peer: int, tag: int = 0) -> None:
        self.p2p.recv(out, dtype, numel, peer, tag)

    def probe(self, peer: int) -> bool:
        return self.p2p.probe(peer)

    def close(self) -> None:
        self.heap.close()


__all__ = ["CpuBackend"]

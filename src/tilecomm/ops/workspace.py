"""A symmetric byte buffer of two halves, alternated by call parity, grown on demand.

The CPU engines of the fused ops (:mod:`tilecomm.ops.cpu`) and of MoE dispatch/combine
(:mod:`tilecomm.moe.cpu`) publish a call's data in half ``k % 2`` before the call's handshake
and read the peers' copies after it. Reuse is safe: the last reads of that half were made in
call ``k - 2``, which every rank finished before entering the handshake of call ``k - 1``,
which this rank has passed. Growing is collective (the ranks agree on the sizes in the
handshake, so they make the same decision) and is followed by a barrier.
"""

from __future__ import annotations

import torch

ALIGN = 64      # chunk starts are 64-byte aligned, like torch's own allocations


def round_up(n: int) -> int:
    return -(-n // ALIGN) * ALIGN


class Workspace:
    """A symmetric byte buffer of two halves, grown on demand, with peer views."""

    def __init__(self):
        self.buf: torch.Tensor | None = None
        self.half = 0
        self.calls = 0
        self._peers: dict[int, torch.Tensor] = {}

    def next_parity(self) -> int:
        """The half of the next call (counts the call)."""
        parity = self.calls % 2
        self.calls += 1
        return parity

    def fits(self, nbytes: int) -> bool:
        return self.buf is not None and nbytes <= self.half

    def grow(self, comm, nbytes: int) -> None:
        """Collective: every rank calls it with the same ``nbytes``."""
        half = round_up(max(nbytes, ALIGN))
        self.buf = self._peers = None
        self.buf = comm.alloc(2 * half, torch.uint8)
        self.half = half
        self._peers = {}

    def region(self, parity: int, offset: int, shape, dtype, rank: int | None = None,
               comm=None) -> torch.Tensor:
        """``shape``/``dtype`` view at ``offset`` of half ``parity``; of ``rank``'s copy when
        given (a view of the peer's shared memory)."""
        buf = self.buf
        if rank is not None and rank != comm.rank:
            buf = self._peers.get(rank)
            if buf is None:
                buf = self._peers[rank] = comm.peer(self.buf, rank)
        n = 1
        for s in shape:
            n *= s
        itemsize = torch.empty((), dtype=dtype).element_size()
        lo = parity * self.half + offset
        return buf[lo:lo + n * itemsize].view(dtype).reshape(shape)

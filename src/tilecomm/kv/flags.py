"""Where a request's layer flags live, and how each side reads and writes them.

A flag per (request slot, sender, layer) holds the generation of the request once the
sender's data for that layer has landed in the receiver's cache (``Board`` lays the slots out;
a flag's index is the same on every rank of a host, so a sender finds it in the receiver's
copy):

* :class:`HostFlags` (CPU caches): the flags are words of the board itself, in shared memory;
  both sides read and write them in place. x86-64 keeps stores in order, so a flag stored
  after the data is seen only after the data.
* :class:`DeviceFlags` (CUDA caches): the flags are a signal pad in the CUDA symmetric heap,
  so the copy kernel can set them after its data with a release store and a kernel on the
  receiver can wait for them (``tilecomm.kv.device``). The host reads them through a pinned
  copy on a stream of its own (never behind the caller's kernels).

Both take indices relative to the first slot (``Board.at``), so the CPU flags tensor is the
board from ``at`` on and the CUDA pad has the board's slot words' length.
"""

from __future__ import annotations

import contextlib

import numpy as np
import torch

from .handles import SRC_HDR, Board


class HostFlags:
    """Layer flags in the board (CPU caches): ``tensor`` is the board from ``Board.at``."""

    def __init__(self, board: Board, tensor: torch.Tensor, peer_boards: dict[int, np.ndarray]):
        self.board, self.tensor = board, tensor
        self.peer_boards = peer_boards
        self._words = board.words

    def index(self, slot: int, j: int, layer: int) -> int:
        """The flag of sender ``j``'s ``layer`` in ``slot``, from the tensor's start."""
        return self.board.sender_at(slot, j) - self.board.at + SRC_HDR + layer

    def landed(self, slot: int, j: int, layer: int, gen: int) -> bool:
        return int(self._words[self.board.at + self.index(slot, j, layer)]) == gen

    def set_own(self, slot: int, j: int, layer: int, gen: int) -> None:
        """This rank's flag (data that arrived from another host)."""
        self._words[self.board.at + self.index(slot, j, layer)] = gen

    def set_peer(self, dst: int, slot: int, j: int, layer: int, gen: int) -> None:
        """``dst``'s flag, after this rank's copies into its cache (stores stay in order)."""
        self.peer_boards[dst][self.board.at + self.index(slot, j, layer)] = gen

    def refresh(self) -> None:
        """Nothing cached: the flags are read in place."""

    def stream(self):
        """The context this side's own flag writes (and what must land before them) run in:
        nothing on the CPU."""
        return contextlib.nullcontext()


class DeviceFlags(HostFlags):
    """Layer flags in a CUDA signal pad (``tensor``, int64, from ``heap.signal_pad``; ``heap``
    spans this host's ranks, ``local_rank_of`` maps a rank of the communicator to its own)."""

    def __init__(self, board: Board, tensor: torch.Tensor, heap, local_rank_of: dict[int, int]):
        super().__init__(board, tensor, {})
        self.heap, self.local_rank_of = heap, local_rank_of
        self._stream = torch.cuda.Stream(tensor.device)
        self._rows: dict[tuple[int, int], np.ndarray] = {}
        self._peers: dict[int, torch.Tensor] = {}

    def landed(self, slot: int, j: int, layer: int, gen: int) -> bool:
        key = (slot, j)
        row = self._rows.get(key)
        if row is None:
            at = self.index(slot, j, 0)
            with torch.cuda.stream(self._stream):
                host = self.tensor[at:at + self.board.layers].to("cpu", non_blocking=True)
            self._stream.synchronize()       # only this copy: the caller's kernels run on
            row = self._rows[key] = host.numpy()
        return int(row[layer]) == gen

    def refresh(self) -> None:
        """Read the flags again at the next ``landed`` (every engine progress calls it)."""
        self._rows.clear()

    def stream(self):
        """The flags' own stream: a kernel on the caller's stream may be waiting for a flag
        this side writes (data from another host), so it must not queue behind it."""
        return torch.cuda.stream(self._stream)

    def set_own(self, slot: int, j: int, layer: int, gen: int) -> None:
        with self.stream():
            self.tensor[self.index(slot, j, layer)].fill_(gen)
        self._rows.pop((slot, j), None)

    def set_peer(self, dst: int, slot: int, j: int, layer: int, gen: int) -> None:
        # on the caller's current stream, behind the copies into dst's cache
        peer = self._peers.get(dst)
        if peer is None:
            peer = self._peers[dst] = self.heap.peer_view(self.tensor, self.local_rank_of[dst])
        peer[self.index(slot, j, layer)].fill_(gen)

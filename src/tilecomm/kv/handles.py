"""The handles of a KV transfer: what the decode side (:class:`ExpectHandle`) and the
prefill side (:class:`PushHandle`) hold for one request, and the board layout they read."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np
import torch

from ..errors import CommMismatch, CommTimeout
from .mailbox import NOTICE, Message

if TYPE_CHECKING:
    from .transfer import KVTransfer

SLOT_HDR = 1              # per slot: the generation of the request it holds (0: free)
SRC_HDR = 4               # per sender of a slot: head src, head dst, head count, transfers
# notice codes
REJECTED, FAILED, UNKNOWN = 1, 2, 3
DATA_TAG0, TAG_SPAN = 16, 1 << 30
_BLOCK = 0.01              # seconds a wait on other hosts sleeps per poll (woken by news)


class ExpectHandle:
    """The decode side of one request: which layers have landed."""

    def __init__(self, kv: KVTransfer, rid: str, srcs: list[int], ids: list[int], slot: int,
                 gen: int):
        self.kv, self.rid, self.srcs, self.ids = kv, rid, srcs, ids
        self.slot, self.gen = slot, gen
        self.layers = kv.geometry.layers
        self.error: Exception | None = None
        self.complete = False
        self._remote_transfers = 0
        self._remote_done = {j: set() for j, s in enumerate(srcs) if kv.is_remote(s)}
        self._pending: dict[tuple[int, int], int] = {}
        self._heads: dict[int, tuple[int, int]] = {}
        self._released = False          # the slot went back: its words belong to others now
        self._local_moves = 0

    @property
    def transfers(self) -> int:
        """Transfers (contiguous moves) that delivered this request so far, all senders
        together."""
        local = sum(int(self._flag(j)[3]) for j, s in enumerate(self.srcs)
                    if j not in self._remote_done) if not self._released else self._local_moves
        return self._remote_transfers + local

    def _flag(self, j: int) -> np.ndarray:
        return self.kv.board.sender(self.slot, j, self.layers)

    def _has(self, j: int, layer: int) -> bool:
        if j in self._remote_done:
            return layer in self._remote_done[j]
        return int(self._flag(j)[SRC_HDR + layer]) == self.gen

    def fail(self, e: Exception) -> None:
        """The request failed here: free its slot and tell its senders (the one at fault
        too), so a push of it that comes later raises there instead of writing into blocks
        this rank may give to another request."""
        if self.error is None and not self.complete:
            self.error = e
            self._release()
            for s in self.srcs:
                self.kv.send_control(s, Message(NOTICE, self.rid, (REJECTED, self.gen),
                                                text=f"rank {self.kv.rank} gave up request "
                                                     f"{self.rid!r}: {e}"))

    def _release(self) -> None:
        self._released = True
        self.kv.release(self)

    # ---- what the engine tells the handle of pushes from other hosts --------------------------
    def remote_push(self, j: int, head_dst: int, head_count: int, transfers: int) -> None:
        """Sender ``j`` (on another host) announced a push: its heads and transfer count."""
        self._heads[j] = (head_dst, head_count)
        self._remote_transfers += transfers

    def remote_transfer_expected(self, j: int, layer: int) -> None:
        """One more transfer of sender ``j``'s ``layer`` is on its way."""
        self._pending[(j, layer)] = self._pending.get((j, layer), 0) + 1

    def remote_transfer_arrived(self, j: int, layer: int) -> None:
        """A transfer of sender ``j``'s ``layer`` landed; the layer is done with its last."""
        key = (j, layer)
        self._pending[key] -= 1
        if not self._pending[key]:
            self._remote_done[j].add(layer)

    def _raise(self) -> None:
        if self.error is not None:
            raise self.error.with_traceback(None)

    def cancel(self, reason: str = "cancelled") -> None:
        """Give the request up: its slot is freed and its senders are told, so a push of it
        that comes later raises on the sender instead of writing into blocks this rank may
        have handed to another request. (A push already copying cannot be stopped: reuse
        the blocks once the senders have been heard from, or after their timeout.)"""
        if self.complete or self.error is not None:
            return
        self.fail(CommMismatch(f"request {self.rid!r} was cancelled on rank {self.kv.rank}: "
                                f"{reason}"))

    def layer_ready(self, i: int) -> bool:
        """True once layer ``i`` of every sender has landed in this rank's cache."""
        if not 0 <= i < self.layers:
            raise ValueError(f"request {self.rid!r}: layer {i} out of range [0, {self.layers})")
        if self.complete:
            return True
        self.kv.progress()
        self._raise()
        return all(self._has(j, i) for j in range(len(self.srcs)))

    def done(self, _block: float = 0.0) -> bool:
        """True once every layer has landed (raises what went wrong, if anything did)."""
        if self.complete:
            return True
        self.kv.progress(_block)
        self._raise()
        if all(self._has(j, i) for j in range(len(self.srcs)) for i in range(self.layers)):
            self._finish()
        return self.complete

    def wait(self, timeout: float | None = None) -> None:
        """Block until every layer has landed; CommTimeout (naming the request, the senders
        still missing and their layers) after ``timeout`` seconds (default: the engine's).
        After a timeout the request stays expected (wait again, or :meth:`cancel` it before
        reusing its blocks)."""
        limit = self.kv.timeout if timeout is None else float(timeout)
        deadline = time.monotonic() + limit
        wait = Backoff()
        # news from other hosts wakes a blocked poll; shared-memory flags need polling
        block = _BLOCK if all(self.kv.is_remote(s) for s in self.srcs) else 0.0
        while not self.done(block):
            if time.monotonic() > deadline:
                missing = {s: [i for i in range(self.layers) if not self._has(j, i)]
                           for j, s in enumerate(self.srcs)}
                missing = {s: v for s, v in missing.items() if v}
                shown = "; ".join(f"rank {s}: layers {_span(v)}" for s, v in missing.items())
                raise CommTimeout(f"kv: request {self.rid!r} (expect #{self.gen} on rank "
                                  f"{self.kv.rank}) incomplete after {limit:g} s, missing "
                                  f"{shown}", collective="kv.expect", seq=self.gen,
                                  missing=tuple(missing))
            if not block:
                wait()

    def _finish(self) -> None:
        kv, geo = self.kv, self.kv.geometry
        for j, s in enumerate(self.srcs):
            if j not in self._remote_done:
                f = self._flag(j)
                self._heads[j] = (int(f[1]), int(f[2]))
                self._local_moves += int(f[3])
        spans = sorted(self._heads.values())
        at, problem = 0, None
        for lo, n in spans:
            if lo != at:
                problem = f"heads {at}..{lo - 1} were not sent" if lo > at else \
                    f"head {lo} was sent twice"
                break
            at = lo + n
        if problem is None and at != geo.kv_heads:
            problem = f"heads {at}..{geo.kv_heads - 1} were not sent"
        if problem:
            self.fail(CommMismatch(f"request {self.rid!r} on rank {kv.rank}: the senders' "
                                    f"head splits {spans} do not tile the {geo.kv_heads} heads "
                                    f"here ({problem})"))
            self._raise()
        self._release()
        self.complete = True


@dataclass
class PushHandle:
    """The prefill side of one push: ``transfers`` contiguous moves of ``nbytes`` bytes."""

    rid: str
    dst: int
    transfers: int
    nbytes: int
    kv: "KVTransfer | None" = None
    pending: int = 0            # inter-host sends not yet complete
    error: Exception | None = None   # the receiver's host went away

    def done(self, _block: float = 0.0) -> bool:
        """True once the data has left this rank's cache (at once inside a host)."""
        if self.pending and self.kv is not None:
            self.kv.progress(_block)
        if self.error is not None:
            raise self.error.with_traceback(None)
        return not self.pending

    def wait(self, timeout: float | None = None) -> None:
        """Block until the data has left this rank's cache; CommTimeout after ``timeout``
        seconds (default: the engine's). Across hosts the receiver must be making progress
        (any of its kv calls) for the data to move."""
        if not self.pending:
            return
        limit = self.kv.timeout if timeout is None else float(timeout)
        deadline = time.monotonic() + limit
        while not self.done(_BLOCK):
            if time.monotonic() > deadline:
                raise CommTimeout(f"kv: push of request {self.rid!r} to rank {self.dst}: "
                                  f"{self.pending} of {self.transfers} transfers not received "
                                  f"after {limit:g} s", collective="kv.push",
                                  missing=(self.dst,))


class Board:
    """The request slots of a rank's board in symmetric memory (int64 words from ``at``): per
    slot a header word (the generation of the request it holds; 0: free) and per sender
    ``SRC_HDR`` words (head src, head dst, head count, transfers) and one flag per layer (the
    generation, once the layer's data landed). Senders on the host write it in place."""

    def __init__(self, words: np.ndarray, at: int, layers: int, senders: int):
        self.words, self.at, self.layers = words, at, layers
        self.sender_words = SRC_HDR + layers
        self.slot_words = SLOT_HDR + senders * self.sender_words

    @staticmethod
    def words_for(slots: int, layers: int, senders: int) -> int:
        return slots * (SLOT_HDR + senders * (SRC_HDR + layers))

    def slot_at(self, slot: int) -> int:
        """Index of ``slot``'s header word."""
        return self.at + slot * self.slot_words

    def sender_at(self, slot: int, j: int) -> int:
        """Index of sender ``j``'s first word in ``slot``."""
        return self.slot_at(slot) + SLOT_HDR + j * self.sender_words

    def sender(self, slot: int, j: int, layers: int) -> np.ndarray:
        """Sender ``j``'s words of ``slot`` (a view): its ``SRC_HDR`` words, then ``layers``
        flags."""
        a = self.sender_at(slot, j)
        return self.words[a:a + SRC_HDR + layers]


@dataclass
class Expectation:
    """What a receiver told this sender about one request."""

    rid: str
    slot: int
    gen: int
    j: int
    nsrc: int
    ids: list
    nblocks: int
    pushed: set = field(default_factory=set)


@dataclass
class Recv:
    """One inter-host data message on its way into this rank's cache (``handle`` None: a
    message of a request that failed here, received only to be dropped)."""

    buf: torch.Tensor
    into: torch.Tensor | None          # where a staged head split goes
    src: int
    handle: ExpectHandle | None
    j: int
    layer: int


def _span(v: list[int]) -> str:
    return f"{v[0]}..{v[-1]}" if len(v) > 1 and v == list(range(v[0], v[-1] + 1)) else str(v)


class Backoff:
    """Poll fast at first, then sleep longer (up to 1 ms) so a long wait leaves the core."""

    def __init__(self):
        self.n = 0

    def __call__(self) -> None:
        self.n += 1
        if self.n > 200:
            time.sleep(min(1e-3, 1e-5 * (self.n - 200)))
        elif self.n > 20:
            time.sleep(0)

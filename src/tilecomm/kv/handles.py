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
REJECTED, FAILED, UNKNOWN, STALLED = 1, 2, 3, 4
#: what ``ExpectHandle.state`` / ``PushHandle.state`` say
PENDING, COMPLETE, FAILED_STATE, STALLED_STATE = "pending", "complete", "failed", "stalled"


DATA_TAG0, TAG_SPAN = 16, 1 << 29     # data tags a sender picks (kv.prepost: the ones above)
_BLOCK = 0.01              # seconds a wait on other hosts sleeps per poll (woken by news)
LANDING_S = 5.0            # how long a failed request's error waits for data still owed


class KVStalled(CommTimeout):
    """A KV request passed its deadline (``expect(..., deadline=)``) with layers missing. It
    has ended on both sides: the receiver's handle, and the sender's push or handle, raise
    it (the side that did not see it pass hears of it by notice); the destination blocks are
    free again on the receiver (for receives posted at expect, once the sender's remaining
    messages landed). ``missing``: the senders whose layers had not landed."""


class ExpectHandle:
    """The decode side of one request: which layers have landed."""

    def __init__(self, kv: KVTransfer, rid: str, srcs: list[int], ids: list[int], slot: int,
                 gen: int, deadline: float):
        self.kv, self.rid, self.srcs, self.ids = kv, rid, srcs, ids
        self.slot, self.gen = slot, gen
        #: seconds the request may take from its expect; it ends STALLED when they pass
        self.deadline = float(deadline)
        self.expires = time.monotonic() + self.deadline
        self.layers = kv.geometry.layers
        self.error: Exception | None = None
        self.complete = False
        self._remote_transfers = 0
        self._remote_done = {j: set() for j, s in enumerate(srcs) if kv.is_remote(s)}
        self._pending: dict[tuple[int, int], int] = {}
        self._heads: dict[int, tuple[int, int]] = {}
        self._released = False          # the slot went back: its words belong to others now
        self._local_moves = 0
        #: receives posted at expect not landed yet (NOTE [receives posted at expect])
        self.inflight = 0
        #: with receives posted at expect: the layers the sender said it pushed (data that
        #: lands without that word is what a failed sender owes, not the request's)
        self.committed: set | None = None

    @property
    def transfers(self) -> int:
        """Transfers (contiguous moves) that delivered this request so far, all senders
        together."""
        local = sum(int(self._flag(j)[3]) for j, s in enumerate(self.srcs)
                    if j not in self._remote_done) if not self._released else self._local_moves
        return self._remote_transfers + local

    @property
    def state(self) -> str:
        """``"pending"``, ``"complete"``, ``"failed"`` (an error, cancel included) or
        ``"stalled"`` (the deadline passed); reading it makes progress, never raises."""
        if not self.complete and self.error is None:
            self.kv.progress()
            if not self.complete and self.error is None:
                return PENDING
        if self.complete:
            return COMPLETE
        return STALLED_STATE if isinstance(self.error, KVStalled) else FAILED_STATE

    @property
    def blocks_free(self) -> bool:
        """True once nothing of this request can still write into its blocks: it completed,
        or it ended and no data posted for it is still on its way (which the next kv calls
        see land). Reuse the blocks of an ended request only then; until then ``expect``
        refuses them, and that refusal is told to the senders like any other."""
        return (self.complete or self.error is not None) and not self.inflight

    def _flag(self, j: int) -> np.ndarray:
        return self.kv.board.sender(self.slot, j, self.layers)

    def _has(self, j: int, layer: int) -> bool:
        if j in self._remote_done:
            return layer in self._remote_done[j] and (self.committed is None or
                                                      layer in self.committed)
        return self.kv.flags.landed(self.slot, j, layer, self.gen)

    def missing(self) -> dict[int, list[int]]:
        """``{sender rank: layers not landed yet}``, senders with none left out."""
        out = {s: [i for i in range(self.layers) if not self._has(j, i)]
               for j, s in enumerate(self.srcs)}
        return {s: v for s, v in out.items() if v}

    def describe_missing(self) -> str:
        return "; ".join(f"rank {s}: layers {_span(v)}" for s, v in self.missing().items())

    def stall(self) -> None:
        """The deadline passed: end the request with :class:`KVStalled` here and at its
        senders (engine's progress calls this)."""
        if self.error is None and not self.complete:
            missing = tuple(self.missing())
            blocks = (f"its blocks {_span(self.ids)} are free again" if not self.inflight else
                      f"its blocks {_span(self.ids)} stay held until the messages already "
                      f"posted for them have landed (the sender sends the rest as zeros)")
            self.fail(KVStalled(
                f"kv: request {self.rid!r} (expect #{self.gen} on rank {self.kv.rank}) "
                f"stalled: its deadline of {self.deadline:g} s passed with "
                f"{self.describe_missing()} still missing; {blocks}",
                collective="kv.expect", seq=self.gen, missing=missing or tuple(self.srcs)),
                code=STALLED)

    def fail(self, e: Exception, code: int = REJECTED) -> None:
        """The request failed here: free its slot and tell its senders (the one at fault
        too), so a push of it that comes later raises there instead of writing into blocks
        this rank may give to another request."""
        if self.error is None and not self.complete:
            self.error = e
            self._release()
            for s in self.srcs:
                self.kv.send_control(s, Message(NOTICE, self.rid, (code, self.gen),
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
            self._landed(j, layer)

    def commit(self, j: int, layers: range) -> None:
        """Sender ``j`` pushed ``layers`` (receives posted at expect): their data counts once
        it has landed."""
        for layer in layers:
            self.committed.add(layer)
            self._landed(j, layer)

    def _landed(self, j: int, layer: int) -> None:
        # this rank's own flag too, for waits on the device (ExpectHandle.wait_on_device)
        if self._has(j, layer):
            self.kv.flags.set_own(self.slot, j, layer, self.gen)

    def _raise(self) -> None:
        if self.error is not None:
            if self.inflight and not isinstance(self.error, KVStalled):
                # the sender sends what it owes at once (it ended the request, or heard so):
                # let it land, so the blocks are free when the caller hears of the failure
                self.kv.await_landing(self, min(self.kv.timeout, LANDING_S))
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

    def device_wait_args(self, i: int) -> tuple:
        """What :func:`tilecomm.kv.kernel.wait_layer` takes to wait for layer ``i`` inside a
        kernel (an attention kernel, before it reads the layer): ``(flags, first, stride,
        nsrc, gen, srcs, heap)``. Senders on other hosts count only once this rank's engine
        has seen their data (any kv call, or ``poll``, makes progress)."""
        if not 0 <= i < self.layers:
            raise ValueError(f"request {self.rid!r}: layer {i} out of range [0, {self.layers})")
        kv = self.kv
        srcs = torch.tensor(self.srcs, dtype=torch.int64, device=kv.cache.device)
        return (kv.flags.tensor, kv.flags.index(self.slot, 0, i), kv.board.sender_words,
                len(self.srcs), self.gen, srcs, kv.heap.handle)

    def wait_on_device(self, i: int) -> None:
        """Queue a wait for layer ``i`` on the current stream (CUDA caches): the work queued
        after it starts once the layer has landed, with no host synchronization. A wait that
        gives up (the heap's wait bound) is recorded; ``kv.check_device()`` raises it. On CPU
        caches the wait runs in the Triton interpreter and returns when the layer is there
        (senders on this host only: the engine makes no progress while it waits)."""
        from .kernel import kv_wait_layer_kernel

        if not self.kv.cache.is_cuda:
            from ..device.heap import require_interpreter
            require_interpreter("kv wait_on_device on CPU caches")
        if self.complete:
            return
        self._raise()
        kv_wait_layer_kernel[(1,)](*self.device_wait_args(i))
        if not self.kv.cache.is_cuda:
            self.kv.interpreted_launches += 1
            self.kv.check_device()

    def done(self, _block: float = 0.0) -> bool:
        """True once every layer has landed (raises what went wrong, if anything did)."""
        if self.complete:
            return True
        self.kv.progress(_block)
        self._raise()
        return self.settle()

    def settle(self) -> bool:
        """Finish the request if every layer has landed, without making progress; True once
        it is complete (raises what went wrong in finishing it)."""
        if not self.complete and self.error is None and \
                all(self._has(j, i) for j in range(len(self.srcs)) for i in range(self.layers)):
            self._finish()
        return self.complete

    def wait(self, timeout: float | None = None) -> None:
        """Block until every layer has landed; CommTimeout (naming the request, the senders
        still missing and their layers) after ``timeout`` seconds (default: the engine's).
        After a timeout the request stays expected (wait again, or :meth:`cancel` it before
        reusing its blocks) until its deadline, when it ends :class:`KVStalled`."""
        limit = self.kv.timeout if timeout is None else float(timeout)
        deadline = time.monotonic() + limit
        wait = Backoff()
        # news from other hosts wakes a blocked poll; shared-memory flags need polling
        block = _BLOCK if all(self.kv.is_remote(s) for s in self.srcs) else 0.0
        while not self.done(block):
            if time.monotonic() > deadline:
                missing = tuple(self.missing())
                raise CommTimeout(f"kv: request {self.rid!r} (expect #{self.gen} on rank "
                                  f"{self.kv.rank}) incomplete after {limit:g} s, missing "
                                  f"{self.describe_missing()}", collective="kv.expect",
                                  seq=self.gen, missing=missing)
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
    """The prefill side of one push: ``transfers`` contiguous moves of ``nbytes`` bytes.

    ``path``: how the data moved: ``"kernel"`` (the Triton copy kernel), ``"copy_engine"``
    (device-to-device copies on CUDA, memcpy on CPU caches) or ``"message"`` (to another
    host). ``layers``: the range it pushed. ``expires``: the request's deadline (monotonic
    seconds), which bounds every wait of the push."""

    rid: str
    dst: int
    transfers: int
    nbytes: int
    kv: "KVTransfer | None" = None
    pending: int = 0            # inter-host sends not yet complete
    error: Exception | None = None   # the receiver's host went away, or the request ended
    path: str = "copy_engine"
    layers: range = range(0)
    expires: float = float("inf")
    event: object = None        # CUDA: recorded after the copies (``query()``: they are done)

    @property
    def state(self) -> str:
        """``"pending"`` (data still leaving this rank), ``"complete"``, ``"failed"`` or
        ``"stalled"`` (the request passed its deadline); never raises."""
        try:
            if not self.done():
                return PENDING
        except KVStalled:
            return STALLED_STATE
        except Exception:  # noqa: BLE001 - the state of a failed push is what is asked
            return FAILED_STATE
        return COMPLETE

    def done(self, _block: float = 0.0) -> bool:
        """True once the data has left this rank's cache (inside a host: at once on CPU
        caches, once the copies finished on the device for CUDA caches)."""
        if self.pending and self.kv is not None:
            self.kv.progress(_block)
        if self.error is not None:
            raise self.error.with_traceback(None)
        if self.event is not None:
            if not self.event.query():
                return False
            self.event = None
        return not self.pending

    def wait(self, timeout: float | None = None) -> None:
        """Block until the data has left this rank's cache; CommTimeout after ``timeout``
        seconds (default: the engine's), KVStalled at the request's deadline if that comes
        first. Across hosts the receiver must be making progress (any of its kv calls) for
        the data to move."""
        if self.done():
            return
        limit = self.kv.timeout if timeout is None else float(timeout)
        start = time.monotonic()
        deadline = min(start + limit, self.expires)
        pause = Backoff()
        while not self.done(_BLOCK if self.pending else 0.0):
            now = time.monotonic()
            if now > deadline:
                left = (f"{self.pending} of {self.transfers} transfers not received"
                        if self.pending else "the copies have not finished on the device")
                if deadline == self.expires:
                    self.error = KVStalled(
                        f"kv: push of request {self.rid!r} (layers {_span(list(self.layers))}) "
                        f"to rank {self.dst} stalled: the request's deadline passed with "
                        f"{left}", collective="kv.push", missing=(self.dst,))
                    raise self.error
                raise CommTimeout(f"kv: push of request {self.rid!r} to rank {self.dst}: "
                                  f"{left} after {limit:g} s", collective="kv.push",
                                  missing=(self.dst,))
            if not self.pending:
                pause()


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
    expires: float = float("inf")       # the request's deadline, monotonic on this rank
    pre: int = -1                       # tag base of receives posted at expect (-1: none)
    plan: tuple | None = None           # (sender's ids, kv.prepost.Plan) of the last push
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

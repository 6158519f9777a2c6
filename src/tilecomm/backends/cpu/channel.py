"""Flags, descriptors and bounded waits over the control blocks of the shared-memory heap.

Each rank writes only its own control block and polls its peers'. Polling spins for a while
(cheapest when every rank has a core), then yields the core on every poll (so 4 ranks on 2
cores make progress), then, in a wait that lasts, sleeps between polls, and checks the clock and the peers' liveness now and then: every wait is
bounded and a timeout names the operation, the sequence number and the missing ranks.

NOTE [descriptor parity]
    A collective's descriptor (what the rank is about to do) goes in slot ``seq % 2``. A rank
    cannot post ``seq + 2`` before every peer has posted ``seq + 1``, which a peer does only
    after reading all descriptors of ``seq``; so two slots never let a fast rank overwrite a
    descriptor a slow rank has yet to read.

NOTE [stop word]
    ``abort()`` and ``revoke()`` (Communicator) write this rank's stop word: the reason into
    the third message area, its length and the rank's next sequence number, the kind last
    (x86-64 keeps stores in order, so a peer that sees the kind sees the reason), then its
    "gave up" word, which every call reads once its peers have arrived. Every wait,
    at its checks every 0.2 s, reads every rank's stop word (its own too: an abort from
    another thread of this process ends this thread's wait the same way), so every call in
    flight on any rank ends within about 0.2 s of the abort, with CommAborted / CommRevoked
    naming the rank that stopped the communicator and why. A rank that has seen a stop word
    refuses every later call at once (``broken``), and a peer that starts a call after the
    stop finds the "gave up" word there. The normal path pays nothing: the stop word itself
    is read only by waits that have blocked for 0.2 s and when a "gave up" word is set.
"""

from __future__ import annotations

import os
import threading
import time
from array import array
import zlib
from typing import Iterable

from ... import procfs
from ...errors import CommAborted, CommError, CommTimeout, stopped_error
from ...settings import settings
from ...heap.base import SegmentLayout, SymmetricHeap

# Descriptor fields (int64 slots within one descriptor).
D_SEQ, D_COLL, D_ALGO, D_DTYPE, D_COUNT, D_OP, D_ROOT, D_EXTRA, D_PIECE, D_PLACE = range(10)
NUM_PLACES = 4
#: where a buffer placed PLACE_CMA lies in its owner's address space (one slot per place)
D_ADDR = D_PLACE + NUM_PLACES
D_MSGLEN = D_ADDR + NUM_PLACES  # length of the error text (error descriptors)

COLL_IDS = {name: i for i, name in enumerate(
    ["all_reduce", "all_gather", "reduce_scatter", "broadcast", "reduce", "all_to_all",
     "all_to_all_v", "barrier", "alloc", "init"], start=1)}
COLL_NAMES = {i: n for n, i in COLL_IDS.items()}
ERROR_ID = 99

#: SegmentLayout.STOP_KIND values (NOTE [stop word])
STOP_NONE, STOP_ABORTED, STOP_REVOKED = range(3)

#: SegmentLayout.ACT_KIND values
ACT_IDLE, ACT_COLLECTIVE, ACT_SEND, ACT_RECV = range(4)
# the activity slots as module constants: begin/end run on every collective, where a class
# attribute lookup per slot shows (docs/benchmarks.md, "The per-call path")
_ACT_KIND, _ACT_PEER, _ACT_NUM = (SegmentLayout.ACT_KIND, SegmentLayout.ACT_PEER,
                                  SegmentLayout.ACT_NUM)
_get_ident = threading.get_ident



def algo_id(name: str) -> int:
    return zlib.crc32(name.encode()) & 0x7FFFFFFF


class Channel:
    """Control-block access for one rank of a communicator."""

    def __init__(self, heap: SymmetricHeap, timeout: float, spin: int):
        self.heap = heap
        self.layout: SegmentLayout = heap.layout
        self.rank, self.world_size = heap.rank, heap.world_size
        self.slots = [heap.slots(r) for r in range(self.world_size)]
        self.me = self.slots[self.rank]
        self.timeout = timeout
        oversubscribed = self.world_size > (os.cpu_count() or 1)
        self.spin = min(spin, 20) if oversubscribed else spin
        #: seconds of yielding before a wait starts sleeping between polls (see
        #: TILECOMM_WAIT_SLEEP_AFTER); the hierarchical backend shortens it, since its host
        #: peers wait while it talks to other hosts
        self.sleep_after = settings().wait_sleep_after
        self.me[SegmentLayout.PID] = os.getpid()
        self.me[SegmentLayout.SELF_ADDR] = heap.segment(self.rank).ctypes.data
        self.step = int(self.me[SegmentLayout.PROGRESS])
        #: why the communicator can no longer be used (set after a timeout), or None
        self.broken: str | None = None
        #: the CommAborted / CommRevoked this rank raises for every call once a rank stopped
        #: the communicator (NOTE [stop word]), or None
        self.stopped: CommAborted | None = None
        #: set (from any thread) to end every wait in progress with a CommError, e.g. by a
        #: process group being destroyed while a send thread waits for its receiver
        self.cancelled: str | None = None
        #: messages this rank sent to / received from each peer (kept by PointToPoint), so
        #: the mismatch check can tell a peer's finished transfer from one waiting for us
        self.msgs_sent = [0] * self.world_size
        self.msgs_recv = [0] * self.world_size
        #: sequence number of the next collective this rank will start
        self.next_seq = 0
        self.owner = threading.get_ident()      # see NOTE [activity]

    # ---- activity -------------------------------------------------------------------------
    # NOTE [activity]: the thread that created the channel (the one making the collectives)
    # publishes what it is doing in ACT_KIND/ACT_PEER/ACT_NUM. Transfers on other threads (the
    # torch backend's send/recv threads) are not published: they do not block the collectives,
    # so a peer waiting in a collective meanwhile is not stuck because of them.
    def begin(self, kind: int, peer: int, num: int) -> bool:
        """Publish what this rank is doing (see SegmentLayout.ACT_KIND); False (nothing
        published) on a thread other than the channel's."""
        if _get_ident() != self.owner:
            return False
        me = self.me
        me[_ACT_PEER] = peer
        me[_ACT_NUM] = num
        me[_ACT_KIND] = kind
        if kind == ACT_COLLECTIVE:
            self.next_seq = num + 1
        return True

    def end(self) -> None:
        self.me[_ACT_KIND] = ACT_IDLE

    def activity(self, rank: int) -> tuple[int, int, int]:
        s = self.slots[rank]
        return (int(s[SegmentLayout.ACT_KIND]), int(s[SegmentLayout.ACT_PEER]),
                int(s[SegmentLayout.ACT_NUM]))

    def last_collective(self, rank: int) -> int:
        """Sequence number of the last collective ``rank`` posted (-1: none)."""
        descs = [self.read_desc(rank, p) for p in (0, 1)]
        return max((d[D_SEQ] for d in descs if d[D_COLL]), default=-1)

    def check_crossed(self, ranks, what) -> None:
        """Raise CommMismatch when this rank and one of ``ranks`` wait for each other in
        different kinds of call: one is in a collective the other has not reached, the other in
        a send or recv with it that this rank has not served. Neither can ever finish. Exact:
        a transfer this rank has already served is finished, not waiting, and a collective this
        rank has not reached cannot have finished on the peer."""
        if threading.get_ident() != self.owner:
            return
        op, seq, _ = what
        me = self.rank
        for r in ranks:
            rk, rpeer, rnum = self.activity(r)
            if op in ("send", "recv"):
                if rk == ACT_COLLECTIVE and rnum >= self.next_seq:
                    self._crossed(f"{op} #{seq} on rank {me}: rank {r} is in "
                                  f"{COLL_NAMES.get(rpeer, 'a collective')} #{rnum}, not in "
                                  f"the matching {'recv' if op == 'send' else 'send'} (this "
                                  f"rank has not called that collective)", self.next_seq)
            elif rk in (ACT_SEND, ACT_RECV) and rpeer == me:
                served = self.msgs_recv[r] if rk == ACT_SEND else self.msgs_sent[r]
                if served <= rnum and self.last_collective(r) < seq:
                    self._crossed(f"{op} #{seq} on rank {me}: rank {r} is in "
                                  f"{_p2p_text(rk, rnum, me)}, not in {op} #{seq}", seq)

    def _crossed(self, text: str, seq: int) -> None:
        from ...errors import CommMismatch

        msg = (f"{text}: a point-to-point call on one rank meets a collective on the other. "
               f"Every rank must make the same collectives in the same order, and a send needs "
               f"the matching recv on its peer")
        # the ranks are out of step now: refuse further calls, and let third ranks waiting
        # for this one stop at once (check_aborts)
        self.broken = msg
        self.me[SegmentLayout.ABORT] = seq + 1
        raise CommMismatch(msg)
        #: the communicator's flight recorder (told only when a wait has had to block) and
        #: the process's tracer (per-peer wait events), or None (tilecomm.debug)
        self.flight = None
        self.trace = None

    # ---- progress -------------------------------------------------------------------------
    def advance(self) -> int:
        """Publish that this rank finished its next step; returns the step number."""
        self.step += 1
        self.me[SegmentLayout.PROGRESS] = self.step
        return self.step

    def wait_progress(self, ranks: Iterable[int], step: int, what: tuple) -> None:
        """Wait until every rank in ``ranks`` has published ``step``."""
        self.wait_slots([(r, SegmentLayout.PROGRESS) for r in ranks], step, what)

    def wait_slots(self, where: list[tuple[int, int]], value: int,
                   what: tuple, recovering: bool = False) -> None:
        """Wait until ``slots[rank][index] >= value`` for every ``(rank, index)`` in ``where``.

        ``what`` is ``(operation, sequence number, what is awaited)`` for the timeout message.
        ``recovering``: a wait of the survivors' shrink on a stopped or broken communicator:
        only the timeout and the peers' deaths end it (not a stop word, a peer that gave up,
        or a cancellation).
        """
        slots = self.slots
        pending = [(slots[r], i, r) for r, i in where if slots[r][i] < value]
        if not pending:
            return
        # NOTE [recording cost] (debug/flight.py): the recorder hears of this wait only once
        # it has blocked (spun, then yielded 64 times), and again every 0.2 s.
        trace, rec = self.trace, None
        t0 = time.time_ns() if trace is not None else 0
        spins, start, next_check, nap = 0, None, 0.0, 0.0
        while True:
            if trace is None:
                pending = [p for p in pending if p[0][p[1]] < value]
            else:
                pending = self._traced(pending, value, t0, what)
            if not pending:
                if rec is not None:
                    self.flight.resumed(rec)
                return
            spins += 1
            if spins < self.spin:
                continue
            if nap:
                time.sleep(nap)         # a long wait: leave the core to whoever has work
                nap = min(nap * 2, 1e-4)
            else:
                os.sched_yield()
                if spins & 63:
                    continue
            now = time.monotonic()
            if start is None:
                start, next_check = now, now + 0.2
                if self.flight is not None:
                    rec = self.flight.waiting(what, [r for _, _, r in pending])
                continue
            if not nap and now - start > self.sleep_after:
                nap = 1e-5
            if now >= next_check:
                next_check = now + 0.2
                if self.flight is not None:
                    rec = self.flight.waiting(what, [r for _, _, r in pending])
                if self.cancelled and not recovering:
                    op, seq, detail = what
                    raise CommError(f"{op} #{seq} on rank {self.rank}: cancelled while waiting "
                                    f"for {detail}: {self.cancelled}")
                if not recovering:
                    self.check_stopped(what)
                dead = [r for _, _, r in pending if not self.alive(r)]
                if dead:
                    self._raise_timeout(what, [r for _, _, r in pending], now - start, dead,
                                        recovering)
                if not recovering:
                    self.check_crossed([r for _, _, r in pending], what)
                    self.check_aborts([r for _, _, r in pending], what)
            if now - start > self.timeout:
                self._raise_timeout(what, [r for _, _, r in pending], now - start, [],
                                    recovering)

    def _traced(self, pending, value, t0: int, what: tuple) -> list:
        """``pending`` less the peers whose slot is there now, each ending a wait event."""
        still = []
        for p in pending:
            if p[0][p[1]] < value:
                still.append(p)
            else:
                self.trace.wait(p[2], t0, what)
        return still

    def alive(self, rank: int) -> bool:
        pid = int(self.slots[rank][SegmentLayout.PID])
        if pid <= 0:
            return True
        st = procfs.state(pid)          # b"" (unreadable): taken as alive
        return st is not None and st not in procfs.ENDED

    def check_aborts(self, ranks, what) -> None:
        """Raise if one of ``ranks`` gave up on a collective (it will never arrive)."""
        for r in ranks:
            gave_up = int(self.slots[r][SegmentLayout.ABORT])
            if gave_up and r != self.rank:
                self.check_stopped(what)        # gave up because the communicator was stopped
                op, seq, _ = what
                self.broken = f"rank {r} gave up at collective #{gave_up - 1}"
                raise CommError(f"{op} #{seq} on rank {self.rank}: rank {r} gave up on "
                                f"collective #{gave_up - 1} after an error (a timeout or a "
                                f"mismatch; see rank {r}'s error); its communicator is "
                                f"unusable, so this one is too")

    # ---- the stop word (NOTE [stop word]) -----------------------------------------------------
    def post_stop(self, kind: int, reason: str, by: int | None = None) -> CommAborted:
        """Stop the communicator on every rank: ``kind`` STOP_ABORTED or STOP_REVOKED,
        ``reason`` said in every rank's error, ``by`` the rank that stopped it as the
        communicator numbers it (ranks that span hosts: the global rank; default this one).
        Any thread. Returns this rank's error for later calls. A second stop keeps the first
        one's word (peers may be reading it)."""
        lay, me = self.layout, self.me
        if not me[lay.stop + lay.STOP_KIND]:
            n = self._write_text(2, reason)
            me[lay.stop + lay.STOP_LEN] = n
            me[lay.stop + lay.STOP_SEQ] = self.next_seq - 1
            me[lay.stop + lay.STOP_BY] = 1 + (self.rank if by is None else by)
            me[lay.stop + lay.STOP_KIND] = kind
            if not me[SegmentLayout.ABORT]:
                # peers that start a call after this one see it in their arrival check (the
                # "gave up" word every call reads, native runner included), not only in waits
                me[SegmentLayout.ABORT] = self.next_seq + 1
        err = self.stop_error(self.rank)
        self.stopped = err
        self.broken = str(err)
        return err

    def first_stop(self) -> int | None:
        """The lowest rank whose stop word is set (this one included), or None."""
        k = self.layout.stop + self.layout.STOP_KIND
        for r, s in enumerate(self.slots):
            if s[k]:
                return r
        return None

    def stop_error(self, rank: int, what: tuple | None = None) -> CommAborted:
        """The error for ``rank``'s stop word; ``what`` ``(operation, seq, ...)`` names the call
        it cut short."""
        lay, s = self.layout, self.slots[rank]
        kind = int(s[lay.stop + lay.STOP_KIND])
        reason = self._read_text(rank, 2, int(s[lay.stop + lay.STOP_LEN])) or "no reason given"
        at = int(s[lay.stop + lay.STOP_SEQ])
        by = int(s[lay.stop + lay.STOP_BY]) - 1
        where = "" if what is None else f"{what[0]} #{what[1]} on rank {self.rank}: "
        return stopped_error(kind == STOP_REVOKED, by, reason, where,
                             f" (its last call was #{at})")

    def check_stopped(self, what: tuple) -> None:
        """Raise the CommAborted / CommRevoked of the first stop word set, naming the call
        ``what`` it cuts short; from then on this rank refuses every call."""
        r = self.first_stop()
        if r is None:
            return
        err = self.stop_error(r, what)
        if self.stopped is None:
            self.stopped = self.stop_error(r)
            self.broken = str(self.stopped)
        raise err

    def unusable(self) -> CommError:
        """The error a call on a broken communicator raises (CommAborted / CommRevoked after a
        stop)."""
        if self.stopped is not None:
            return type(self.stopped)(str(self.stopped), by=self.stopped.by,
                                      reason=self.stopped.reason)
        return CommError(f"communicator unusable: {self.broken}; create a new one")

    def _raise_timeout(self, what, missing, waited, dead, recovering=False) -> None:
        op, seq, detail = what
        if op not in ("send", "recv") and not recovering:
            # Tell late peers, so they raise instead of completing a call this rank abandoned.
            self.me[SegmentLayout.ABORT] = int(seq) + 1
        states = "; ".join(f"rank {r} {self.describe_peer(r)}" for r in missing)
        if dead:
            cause = f"rank(s) {dead} exited"
        else:
            cause = (f"no progress from rank(s) {missing} in {waited:.1f} s (the timeout is "
                     f"{self.timeout:g} s)")
        msg = (f"{op} #{seq} on rank {self.rank}: {cause} while waiting for {detail}. "
               f"{states}.")
        raise CommTimeout(msg, collective=op, seq=int(seq), missing=tuple(missing))

    # ---- descriptors ----------------------------------------------------------------------
    def desc_base(self, seq: int) -> int:
        return SegmentLayout.DESC + (seq & 1) * SegmentLayout.DESC_LEN

    def post_desc(self, seq: int, fields: list[int]) -> None:
        base = self.desc_base(seq)
        self.me[base:base + len(fields)] = array("q", fields)

    def read_desc(self, rank: int, seq: int) -> list[int]:
        base = self.desc_base(seq)
        return list(self.slots[rank][base:base + SegmentLayout.DESC_LEN])

    def post_message(self, seq: int, text: str) -> int:
        return self._write_text(seq & 1, text)

    def read_message(self, rank: int, seq: int, length: int) -> str:
        return self._read_text(rank, seq & 1, length)

    def _write_text(self, area: int, text: str) -> int:
        """Write ``text`` (cut to MSG_BYTES at a character boundary) into message area
        ``area`` (0, 1: error descriptors by parity; 2: the stop reason); returns its bytes."""
        data = text.encode()
        if len(data) > SegmentLayout.MSG_BYTES:
            data = data[: SegmentLayout.MSG_BYTES].decode(errors="ignore").encode()
        off = self.layout.msg_offset + area * SegmentLayout.MSG_BYTES
        seg = self.heap.segment(self.rank)
        seg[off:off + len(data)] = memoryview(data)
        return len(data)

    def _read_text(self, rank: int, area: int, length: int) -> str:
        off = self.layout.msg_offset + area * SegmentLayout.MSG_BYTES
        return bytes(self.heap.segment(rank)[off:off + length]).decode(errors="replace")

    def describe_peer(self, rank: int) -> str:
        """What ``rank`` is doing, or last announced, as a predicate ("is in send #0 to rank 1")
        for timeout messages."""
        kind, peer, num = self.activity(rank)
        step = int(self.slots[rank][SegmentLayout.PROGRESS])
        if kind in (ACT_SEND, ACT_RECV):
            return "is in " + _p2p_text(kind, num, peer)
        if kind == ACT_COLLECTIVE:
            return f"is in {COLL_NAMES.get(peer, '?')} #{num} (step {step})"
        best = None
        for parity in (0, 1):
            d = self.read_desc(rank, parity)
            if d[D_COLL] and (best is None or d[D_SEQ] > best[D_SEQ]):
                best = d
        if best is None:
            return f"is at step {step}, no collective posted yet"
        name = COLL_NAMES.get(best[D_COLL], "error" if best[D_COLL] == ERROR_ID else "?")
        return f"is in no tilecomm call; its last was {name} #{best[D_SEQ]} (step {step})"


def _p2p_text(kind: int, num: int, peer: int) -> str:
    return f"send #{num} to rank {peer}" if kind == ACT_SEND else f"recv #{num} from rank {peer}"

"""Point-to-point send/recv over per-pair mailboxes in the sender's segment.

The sender copies a piece into its mailbox for ``dst`` and bumps ``sent_to[dst]``; the receiver
copies it out and bumps ``done_from[src]``, which frees the mailbox for the next piece. A send
returns once the receiver has taken the last piece (like MPI_Ssend), so a mismatch the receiver
detects reaches the sender in the same call: the receiver records what it expected in
``err_*[src]`` and both raise :class:`CommMismatch`.
"""

from __future__ import annotations

import numpy as np

from ...errors import CommMismatch, CommTimeout
from ...types import DTYPE_BY_ID, DType
from .channel import ACT_RECV, ACT_SEND, Channel

SENT, DONE, ERR, ERR_DTYPE, ERR_NUMEL = range(5)
HEADER = 64  # bytes: msg id, dtype id, numel, npieces, tag (int64 each), padded


class PointToPoint:
    def __init__(self, channel: Channel, heap):
        self.ch, self.heap, self.layout = channel, heap, heap.layout
        self.rank, self.world_size = channel.rank, channel.world_size
        w = self.world_size
        self.sent = [0] * w          # pieces posted to dst
        self.done = [0] * w          # pieces consumed from src
        self.msgs_sent = channel.msgs_sent      # shared with the channel (check_crossed)
        self.msgs_recv = channel.msgs_recv
        self.capacity = self.layout.p2p_slot_bytes - HEADER

    def _slot(self, array: int, peer: int) -> int:
        return self.layout.p2p_slot(array, peer)

    def send(self, data: np.ndarray, d: DType, numel: int, dst: int, tag: int = 0) -> None:
        self._guarded(ACT_SEND, dst, self.msgs_sent[dst], self._send, data, d, numel, dst, tag)

    def recv(self, out: np.ndarray, d: DType, numel: int, src: int, tag: int = 0) -> None:
        self._guarded(ACT_RECV, src, self.msgs_recv[src], self._recv, out, d, numel, src, tag)

    def probe(self, src: int) -> bool:
        """True when ``src`` has posted a piece this rank has not consumed yet."""
        return int(self.ch.slots[src][self._slot(SENT, self.rank)]) > self.done[src]

    def _guarded(self, kind: int, peer: int, msg: int, fn, *args) -> None:
        """A timed-out transfer leaves the pair's counters unknowable: refuse further use.
        The transfer is published as this rank's activity (NOTE [activity] in channel.py)."""
        if self.ch.broken:
            raise self.ch.unusable()
        published = self.ch.begin(kind, peer, msg)
        try:
            fn(*args)
        except CommTimeout as e:
            self.ch.broken = str(e)
            raise
        finally:
            if published and not self.ch.broken:   # a broken one shows where it stopped
                self.ch.end()

    def _send(self, data: np.ndarray, d: DType, numel: int, dst: int, tag: int) -> None:
        ch, me = self.ch, self.rank
        msg = self.msgs_sent[dst]
        self.msgs_sent[dst] += 1
        nbytes = data.nbytes
        npieces = max(1, -(-nbytes // self.capacity))
        base = self.sent[dst]
        mailbox = self.heap.segment(me)[self.layout.p2p_data(dst):]
        header = mailbox[:HEADER].view(np.int64)
        what = ("send", msg, f"rank {dst} to receive")
        done_slot = [(dst, self._slot(DONE, me))]
        for i in range(npieces):
            ch.wait_slots(done_slot, base + i, what)
            self._raise_if_rejected(dst, msg, d, numel, base, npieces, tag)
            header[:5] = (msg, d.id, numel, npieces, tag)
            lo = i * self.capacity
            chunk = data[lo:lo + self.capacity]
            np.copyto(mailbox[HEADER:HEADER + chunk.nbytes], chunk)
            self.sent[dst] = base + i + 1
            ch.me[self._slot(SENT, dst)] = base + i + 1
        ch.wait_slots(done_slot, base + npieces, what)
        self._raise_if_rejected(dst, msg, d, numel, base, npieces, tag)

    def _raise_if_rejected(self, dst, msg, d, numel, base, npieces, tag) -> None:
        peer = self.ch.slots[dst]
        if peer[self._slot(ERR, self.rank)] != msg + 1:
            return
        self.sent[dst] = base + npieces
        self.ch.me[self._slot(SENT, dst)] = base + npieces
        want_d = DTYPE_BY_ID.get(int(peer[self._slot(ERR_DTYPE, self.rank)]))
        want_n = int(peer[self._slot(ERR_NUMEL, self.rank)])
        if want_d is d and want_n == numel:     # what differed is the tag
            raise CommMismatch(f"send #{msg} to rank {dst}: rank {dst} posted a recv with another "
                               f"tag than this send's tag {tag}; messages between two ranks "
                               f"are matched in posting order, so tags must agree in order")
        raise CommMismatch(f"send #{msg} to rank {dst}: sent {numel} x {d.name}, but rank {dst} "
                           f"expects {want_n} x {want_d.name if want_d else '?'}")

    def _recv(self, out: np.ndarray, d: DType, numel: int, src: int, tag: int) -> None:
        ch, me = self.ch, self.rank
        msg = self.msgs_recv[src]
        self.msgs_recv[src] += 1
        base = self.done[src]
        mailbox = self.heap.segment(src)[self.layout.p2p_data(me):]
        header = mailbox[:HEADER].view(np.int64)
        what = ("recv", msg, f"rank {src} to send")
        sent_slot = [(src, self._slot(SENT, me))]
        ch.wait_slots(sent_slot, base + 1, what)
        got_msg, got_d, got_n, npieces, got_tag = (int(x) for x in header[:5])
        if (got_d, got_n, got_tag) != (d.id, numel, tag) or got_msg != msg:
            # Reject the message that arrived, under its own id (the sender checks that id).
            ch.me[self._slot(ERR_DTYPE, src)] = d.id
            ch.me[self._slot(ERR_NUMEL, src)] = numel
            ch.me[self._slot(ERR, src)] = got_msg + 1
            self.done[src] = base + npieces
            ch.me[self._slot(DONE, src)] = base + npieces
            sent_d = DTYPE_BY_ID.get(got_d)
            if got_msg != msg:
                raise CommMismatch(f"recv #{msg} from rank {src}: rank {src} sent message "
                                   f"#{got_msg}; send and recv calls are out of step")
            if (got_d, got_n) == (d.id, numel):
                raise CommMismatch(f"recv #{msg} from rank {src}: expected tag {tag}, but rank "
                                   f"{src} sent tag {got_tag}; messages between two ranks are "
                                   f"matched in posting order, so tags must agree in order")
            raise CommMismatch(f"recv #{msg} from rank {src}: expected {numel} x {d.name}, but "
                               f"rank {src} sent {got_n} x {sent_d.name if sent_d else '?'}")
        for i in range(npieces):
            if i:
                ch.wait_slots(sent_slot, base + i + 1, what)
            lo = i * self.capacity
            n = min(self.capacity, out.nbytes - lo)
            np.copyto(out[lo:lo + n], mailbox[HEADER:HEADER + n])
            self.done[src] = base + i + 1
            ch.me[self._slot(DONE, src)] = base + i + 1

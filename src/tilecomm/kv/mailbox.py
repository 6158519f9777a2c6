"""Control messages of the KV transfer engine, and the two ways they travel.

A message is a fixed-size block of int64 words (its size depends only on the largest cache in
the group, so every receive has the right size):

```
| kind | seq | request hash | args (13 words) | request id text (64 B) | payload: block ids or text |
```

* :class:`ShmMailbox` (ranks of one host): every rank's board holds one ring of message slots
  per writer. The writer fills a slot and then bumps its ``written`` counter (a single aligned
  8-byte store; x86-64 keeps stores in order, so the slot is visible once the counter is); the
  owner reads in order and publishes how far it has read, so a writer never overwrites an
  unread slot.
* :class:`GlooMailbox` (ranks of other hosts): one receive per remote rank is always posted on
  the engine's own Gloo group, by a thread that hands each message over.

Both deliver each writer's messages in the order sent; ``poll`` never blocks.
"""

from __future__ import annotations

import hashlib
import time
from dataclasses import dataclass, field

import numpy as np
import torch

from ..errors import CommError

EXPECT, PUSH, NOTICE, CLOSE = 1, 2, 3, 4
KIND_NAMES = {EXPECT: "expect", PUSH: "push", NOTICE: "notice", CLOSE: "close"}
ARGS = 13
HDR_WORDS = 3 + ARGS
RID_BYTES = 64
RID_WORDS = RID_BYTES // 8
TEXT_BYTES = 512
CTRL_TAG = 1                     # Gloo tag of control messages; data tags start above it


def request_key(request_id) -> str:
    """A request id (str or int) as the text both sides compare (so 5 and "5" name the same
    request); ValueError if unusable."""
    if isinstance(request_id, bool) or not isinstance(request_id, (str, int)):
        raise ValueError(f"request_id must be a str or an int, got {type(request_id).__name__}")
    text = str(request_id)
    if not text or len(text.encode()) > RID_BYTES:
        raise ValueError(f"request_id must be 1-{RID_BYTES} bytes as text, got {text!r}")
    return text


def request_hash(key: str) -> int:
    return int.from_bytes(hashlib.blake2b(key.encode(), digest_size=8).digest(), "little") >> 1


@dataclass
class Message:
    kind: int
    rid: str
    args: tuple = ()
    ids: list = field(default_factory=list)     # block ids (see Codec.decode)
    text: str = ""                               # NOTICE
    seq: int = 0


class Codec:
    """Encodes messages into blocks of ``words`` int64s (the same size on every rank)."""

    def __init__(self, max_blocks: int):
        self.payload = max(2 * max_blocks, TEXT_BYTES // 8)
        self.words = HDR_WORDS + RID_WORDS + self.payload

    def encode(self, m: Message, out: np.ndarray) -> None:
        out[:HDR_WORDS] = 0
        out[0], out[1], out[2] = m.kind, m.seq, request_hash(m.rid)
        out[3:3 + len(m.args)] = m.args
        rid = np.zeros(RID_BYTES, dtype=np.uint8)
        raw = m.rid.encode()
        rid[:len(raw)] = np.frombuffer(raw, dtype=np.uint8)
        out[HDR_WORDS:HDR_WORDS + RID_WORDS] = rid.view(np.int64)
        body = out[HDR_WORDS + RID_WORDS:]
        if m.text:
            t = m.text.encode()[:TEXT_BYTES]
            b = np.zeros(TEXT_BYTES, dtype=np.uint8)
            b[:len(t)] = np.frombuffer(t, dtype=np.uint8)
            out[3 + ARGS - 1] = len(t)
            body[:TEXT_BYTES // 8] = b.view(np.int64)
        elif m.ids:
            body[:len(m.ids)] = m.ids

    def decode(self, w: np.ndarray) -> Message:
        """The message in ``w``; EXPECT carries ``args[0]`` block ids (the receiver's), PUSH
        twice as many (the sender's, then the receiver's)."""
        kind, seq = int(w[0]), int(w[1])
        nids = int(w[3]) * {EXPECT: 1, PUSH: 2}.get(kind, 0)
        args = tuple(int(x) for x in w[3:3 + ARGS])
        rid = bytes(w[HDR_WORDS:HDR_WORDS + RID_WORDS].view(np.uint8)).rstrip(b"\0").decode(
            errors="replace")
        body = w[HDR_WORDS + RID_WORDS:]
        m = Message(kind, rid, args, seq=seq)
        if kind == NOTICE:
            n = args[ARGS - 1]
            m.text = bytes(body[:TEXT_BYTES // 8].view(np.uint8)[:n]).decode(errors="replace")
        elif nids:
            m.ids = [int(x) for x in body[:nids]]
        return m


class ShmMailbox:
    """Messages between the ranks of one host, through their boards (symmetric int64 tensors).

    Board layout, for each writer local rank ``w``: ``written[w]``, ``consumed[w]``, then a
    ring of ``slots`` messages; ``board_words`` says how many words that takes.
    """

    def __init__(self, codec: Codec, board: torch.Tensor, peer_boards: dict, my_local: int,
                 local_rank_of: dict, slots: int, base: int):
        self.codec, self.slots, self.base = codec, slots, base
        self.mine = board.numpy()
        self.peers = {r: b.numpy() for r, b in peer_boards.items()}   # global rank -> board
        self.me = my_local
        self.local_rank_of = local_rank_of            # global rank -> local rank
        self.read = {r: 0 for r in peer_boards}        # messages read from each writer
        self.sent = {r: 0 for r in peer_boards}        # messages written to each owner

    @staticmethod
    def board_words(codec: Codec, writers: int, slots: int) -> int:
        return writers * (2 + slots * codec.words)

    def _ring(self, board: np.ndarray, writer_local: int) -> tuple[int, np.ndarray]:
        per = 2 + self.slots * self.codec.words
        at = self.base + writer_local * per
        return at, board[at:at + per]

    def room(self, dst: int) -> bool:
        _, ring = self._ring(self.peers[dst], self.me)
        return self.sent[dst] - int(ring[1]) < self.slots

    def send(self, dst: int, m: Message) -> None:
        """Write ``m`` into ``dst``'s ring; the caller checked :meth:`room`."""
        _, ring = self._ring(self.peers[dst], self.me)
        k = self.sent[dst]
        m.seq = k + 1
        slot = ring[2 + (k % self.slots) * self.codec.words:][:self.codec.words]
        self.codec.encode(m, slot)
        self.sent[dst] = k + 1
        ring[0] = k + 1              # publish after the slot (stores stay in order on x86-64)

    def poll(self) -> list[tuple[int, Message]]:
        """Every unread message, as (writer's global rank, message)."""
        got = []
        for r in self.read:
            _, ring = self._ring(self.mine, self.local_rank_of[r])
            while self.read[r] < int(ring[0]):
                k = self.read[r]
                w = ring[2 + (k % self.slots) * self.codec.words:][:self.codec.words].copy()
                got.append((r, self.codec.decode(w)))
                self.read[r] = k + 1
                ring[1] = k + 1      # the slot may be reused
        return got


class GlooMailbox:
    """Messages (over ``pg``) and data (over ``data_pg``) to and from ranks of other hosts: the
    engine's own Gloo groups, made with a timeout longer than any wait of the engine's (the
    engine bounds its waits itself, and an idle peer must not look like a failed one).

    A Gloo work reports completion only from ``wait()``, which blocks, so waiting threads do
    it: per remote rank, one that keeps a control receive posted and hands each message over,
    and one that waits in order for the data receives and sends posted to that rank (one TCP
    connection per pair, so they complete in posting order). :meth:`poll` collects what they
    saw, never blocking; ``token`` is the caller's name for a work.
    """

    def __init__(self, codec: Codec, pg, data_pg, peers: list[int],
                 device: torch.device | None = None):
        import queue
        import threading

        # Control and data on separate groups (separate TCP connections): a Gloo send takes
        # its pair's lock, which the I/O thread holds while it writes a large message, so a
        # control message behind 2 MiB of data cost ~0.7 ms to post (measured)
        self.codec, self.pg, self.data_pg = codec, pg, data_pg
        # CUDA data (NCCL): a work's wait() only orders the waiting thread's stream after it;
        # the fifo thread then synchronizes that stream, so "done" means the bytes are there
        self.device = device if device is not None and device.type == "cuda" else None
        self.nbytes = codec.words * 8
        self.done: queue.SimpleQueue = queue.SimpleQueue()
        self.seq = {p: 0 for p in peers}
        self.fifos = {p: queue.SimpleQueue() for p in peers}
        self.threads = []
        for p in peers:
            for fn in (self._control, self._fifo):
                t = threading.Thread(target=fn, args=(p,), daemon=True,
                                     name=f"tilecomm-kv-{fn.__name__[1:]}-{p}")
                t.start()
                self.threads.append(t)

    def _control(self, p: int) -> None:
        while True:
            buf = torch.empty(self.nbytes, dtype=torch.uint8)
            try:
                self.pg.recv([buf], p, CTRL_TAG).wait()
            except RuntimeError as e:
                self.done.put(("error", p, f"receiving a control message: {e}"))
                return
            m = self.codec.decode(buf.numpy().view(np.int64))
            self.done.put(("message", p, m))
            if m.kind == CLOSE:
                return

    def _fifo(self, p: int) -> None:
        q = self.fifos[p]
        if self.device is not None:
            torch.cuda.set_device(self.device)
        while True:
            item = q.get()
            if item is None:
                return
            work, token, _keep = item
            try:
                work.wait()
                if self.device is not None:
                    torch.cuda.current_stream(self.device).synchronize()
            except RuntimeError as e:
                self.done.put(("error", p, f"{token[0]}: {e}"))
            else:
                self.done.put(("done", p, token))
            # this frame must not keep the last message's tensor (a view of the cache) alive
            # until the next one: the symmetric heap frees a block when its last view dies,
            # and every rank must free in the same order
            del item, work, token, _keep

    def _post(self, peer: int, start, token, keep) -> None:
        """Queue the work ``start()`` returns for ``peer``'s waiting thread. Gloo refuses to
        post at all on a pair whose peer has already gone (a RuntimeError now, not at wait):
        that is reported as the waiting thread would report it, so the caller names the peer
        either way."""
        try:
            work = start()
        except RuntimeError as e:
            self.done.put(("error", peer, f"{token[0]}: {e}"))
            return
        self.fifos[peer].put((work, token, keep))

    def send(self, dst: int, m: Message) -> None:
        self.seq[dst] += 1
        m.seq = self.seq[dst]
        buf = torch.empty(self.nbytes, dtype=torch.uint8)
        self.codec.encode(m, buf.numpy().view(np.int64))
        self._post(dst, lambda: self.pg.send([buf], dst, CTRL_TAG), ("control", None), buf)

    def post_send(self, dst: int, t: torch.Tensor, tag: int, token) -> None:
        self._post(dst, lambda: self.data_pg.send([t], dst, tag), token, t)

    def post_recv(self, src: int, t: torch.Tensor, tag: int, token) -> None:
        self._post(src, lambda: self.data_pg.recv([t], src, tag), token, t)

    def poll(self, block: float = 0.0) -> list[tuple]:
        """What the threads saw since the last poll: ("message", peer, Message),
        ("done", peer, token) or ("error", peer, text). ``block``: seconds to wait for the
        first one when there is none (a waiting caller sleeps instead of spinning, which
        here would take a core from Gloo's own threads)."""
        import queue

        got = []
        if self.done.empty():
            if block > 0:
                try:
                    got.append(self.done.get(timeout=block))
                except queue.Empty:
                    return got
            else:
                # let the waiting threads take the GIL: a caller spinning on layer_ready
                # would otherwise hold it for Python's whole switch interval (5 ms) at a
                # time, and every completion they report waits for it
                time.sleep(0)
        while not self.done.empty():
            got.append(self.done.get())
        return got

    def stop(self, timeout: float = 5.0) -> None:
        """End the waiting threads (the control threads end with the peers' CLOSE) and drop
        what they reported, so nothing of this engine keeps a view of the cache."""
        for q in self.fifos.values():
            q.put(None)
        end = time.monotonic() + timeout
        for t in self.threads:
            if "fifo" in t.name:
                t.join(max(0.0, end - time.monotonic()))
        while not self.done.empty():
            self.done.get()


class KVClosed(CommError):
    """The KV transfer engine was closed."""

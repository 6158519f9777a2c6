"""KV-cache transfer between prefill and decode ranks: paged, layer by layer, many requests.

Protocol (one request, one sender ``s``, one receiver ``d``; several senders when the heads of
one receiver come from several prefill ranks):

1. ``d.expect(rid, src=s, block_ids)`` takes a request slot in ``d``'s board, clears its
   layer flags and sends EXPECT (slot, generation, destination block ids) to ``s``.
2. ``s.push(rid, dst=d, block_ids, layers)`` waits (bounded) for that EXPECT, checks the two
   sides agree (block count, geometry, heads), and moves the layers' blocks as the
   coalesced runs of :mod:`.schedule` -- one transfer per (layer, K/V, run):
   * same host: copies straight into ``d``'s cache (symmetric memory), then stores the
     generation into ``d``'s flag for each layer it finished (stores stay in order on x86-64,
     so the data is visible once the flag is);
   * other host: sends PUSH (layers, source ids, first data tag) and one Gloo message per
     transfer, read from and written to the caches in place (staged only for head splits).
3. ``d``'s handle reports a layer ready once every sender delivered it.

Whatever one side finds wrong it raises and tells the other side (NOTICE), which raises on
its next call: bad input never leaves a peer waiting for the timeout. Every wait is bounded
and a timeout names the request and the peer.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np
import torch

from ..errors import CommMismatch, CommTimeout
from . import mailbox as mb
from .mailbox import CLOSE, EXPECT, NOTICE, PUSH, Codec, Message, request_key
from .schedule import CacheGeometry, HeadSplit, check_block_ids, coalesce, transfers

MAX_SOURCES = 8            # senders one request may gather heads from
_SRC_HDR = 4               # per sender of a slot: head src, head dst, head count, transfers
# notice codes
REJECTED, FAILED, UNKNOWN = 1, 2, 3
DATA_TAG0, TAG_SPAN = 16, 1 << 30
_BLOCK = 0.01              # seconds a wait on other hosts sleeps per poll (woken by news)
_IDLE_OK = 7 * 24 * 3600.0  # Gloo timeout of the engine's group (see paged_cache)


class KVTransfer:
    """Moves paged KV-cache blocks from prefill ranks to decode ranks over ``comm``.

    Every rank of ``comm`` creates one and calls :meth:`paged_cache` once (collective);
    after that :meth:`expect` and :meth:`push` are point-to-point and need no partner call
    order. ``max_requests``: requests one rank may expect at once (request slots).
    """

    def __init__(self, comm, *, max_requests: int = 64, ring_slots: int = 32,
                 timeout: float | None = None):
        if max_requests < 1 or ring_slots < 1:
            raise ValueError("max_requests and ring_slots must be >= 1")
        self.comm = comm
        self.rank = comm.rank
        self.timeout = comm.timeout if timeout is None else float(timeout)
        self.max_requests, self.ring_slots = int(max_requests), int(ring_slots)
        self.cache: torch.Tensor | None = None
        self.geometries: list[CacheGeometry] = []
        self._closed = False
        # receiver side
        self._handles: dict[str, ExpectHandle] = {}       # open requests by id
        self._by_slot: dict[int, ExpectHandle] = {}
        self._gen = 0
        self._early: dict[tuple[int, str], str] = {}      # notices before the expect
        self._errors: list[Exception] = []                 # raised at the next call
        self._recvs = 0                                    # inter-host receives in flight
        # sender side
        self._expects: dict[tuple[int, str], _Expectation] = {}
        self._rejected: dict[tuple[int, str], str] = {}
        self._pushes: list[PushHandle] = []
        self._tags: dict[int, int] = {}
        self._peer_caches: dict[int, torch.Tensor] = {}
        self._closed_by: set[int] = set()

    # ---- setup ------------------------------------------------------------------------------
    def paged_cache(self, *, num_layers: int, num_blocks: int, block_size: int, kv_heads: int,
                    head_dim: int, dtype: torch.dtype = torch.bfloat16,
                    device: str = "cpu") -> torch.Tensor:
        """This rank's cache, zero-filled: ``[num_layers, 2, num_blocks, block_size, kv_heads,
        head_dim]`` (K and V per layer, vLLM's per-layer layout), in symmetric memory.

        Collective: every rank calls it once; geometries may differ between ranks (prefill and
        decode may use different tensor-parallel layouts: ``kv_heads`` is this rank's share).
        """
        self._check_open()
        if self.cache is not None:
            raise ValueError("paged_cache: this KVTransfer already has its cache")
        if torch.device(device).type != "cpu":
            raise ValueError(f"paged_cache: device {device!r} is not supported yet: the engine "
                             f"moves CPU tensors (shared memory in a host, Gloo across hosts)")
        g = CacheGeometry(num_layers, num_blocks, block_size, kv_heads, head_dim, dtype)
        rows = self.comm.exchange(g.words() + [self.max_requests, self.ring_slots])
        self.geometries = [CacheGeometry.from_words(r[:6]) for r in rows]
        self.max_requests = max(r[6] for r in rows)
        self.ring_slots = max(r[7] for r in rows)
        lay = self.comm.layout
        max_bytes = max(x.nbytes for x in self.geometries)
        self._l_max = max(x.layers for x in self.geometries)
        self._codec = Codec(max(x.blocks for x in self.geometries))
        self._raw = self.comm.alloc(max_bytes, torch.uint8)
        self.cache = self._raw[:g.nbytes].view(dtype).view(g.shape)
        host = lay.hosts[lay.host_of(self.rank)]
        self._local = [r for r in host if r != self.rank]
        self._remote = [r for r in range(self.comm.world_size) if r not in host]
        ring_words = mb.ShmMailbox.board_words(self._codec, lay.max_local, self.ring_slots)
        self._slot_words = MAX_SOURCES * (_SRC_HDR + self._l_max)
        self._slots_at = ring_words
        self._board = self.comm.alloc(ring_words + self.max_requests * self._slot_words,
                                      torch.int64)
        self._board_np = self._board.numpy()
        self._peer_boards = {r: self.comm.peer(self._board, r).numpy() for r in self._local}
        self._shm = mb.ShmMailbox(
            self._codec, self._board, {r: self.comm.peer(self._board, r) for r in self._local},
            lay.local_rank(self.rank), {r: lay.local_rank(r) for r in self._local},
            self.ring_slots, 0)
        self._free = list(range(self.max_requests))[::-1]
        # the engine bounds every wait itself; Gloo's own timeout would fire on an idle peer
        self._gloo = None
        if lay.num_hosts > 1:
            self._gloo = mb.GlooMailbox(
                self._codec, self.comm.process_group("kv-control", timeout=_IDLE_OK),
                self.comm.process_group("kv-data", timeout=_IDLE_OK), self._remote)
        self._tags = {r: 0 for r in self._remote}
        return self.cache

    @property
    def geometry(self) -> CacheGeometry:
        self._check_cache()
        return self.geometries[self.rank]

    # ---- decode side ------------------------------------------------------------------------
    def expect(self, request_id, src, block_ids) -> "ExpectHandle":
        """Announce where request ``request_id``'s blocks must land in this rank's cache.

        ``src``: the prefill rank that pushes it, or a list of ranks when this rank's heads
        come from several (each pushes its heads with ``head_split``). ``block_ids``: this
        rank's blocks, in token order. Returns at once; the handle tells when layers land.
        """
        self._check_cache()
        self.poll()
        rid = request_key(request_id)
        srcs = [src] if isinstance(src, int) and not isinstance(src, bool) else list(src)
        try:
            self._check_sources(srcs, rid)
            ids = check_block_ids(block_ids, self.geometry, f"expect of request {rid!r}")
            if rid in self._handles:
                raise ValueError(f"expect: request {rid!r} is already expected here (from "
                                 f"rank(s) {self._handles[rid].srcs}); ids must be unique among "
                                 f"requests in flight")
            if not self._free:
                raise ValueError(f"expect: {self.max_requests} requests are already in flight "
                                 f"on rank {self.rank}; wait for some, or make the KVTransfer "
                                 f"with a larger max_requests")
        except ValueError as e:
            for s in srcs:
                if isinstance(s, int) and 0 <= s < self.comm.world_size and s != self.rank:
                    self._send(s, Message(NOTICE, rid, (REJECTED,),
                                          text=f"rank {self.rank} rejected request {rid!r}: "
                                               f"{e}"))
            raise
        slot = self._free.pop()
        self._gen += 1
        h = ExpectHandle(self, rid, srcs, ids, slot, self._gen)
        at = self._slots_at + slot * self._slot_words
        self._board_np[at:at + self._slot_words] = 0
        self._handles[rid] = self._by_slot[slot] = h
        for j, s in enumerate(srcs):
            self._send(s, Message(EXPECT, rid, (len(ids), slot, h.gen, j, len(srcs)), ids=ids))
        for j, s in enumerate(srcs):
            text = self._early.pop((s, rid), None)
            if text is not None:
                h._fail(CommMismatch(text))
        return h

    def _check_sources(self, srcs, rid: str) -> None:
        if not srcs or len(srcs) > MAX_SOURCES:
            raise ValueError(f"expect of request {rid!r}: src must name 1-{MAX_SOURCES} ranks, "
                             f"got {srcs!r}")
        mine = self.geometry
        for s in srcs:
            if isinstance(s, bool) or not isinstance(s, int) or not 0 <= s < self.comm.world_size:
                raise ValueError(f"expect of request {rid!r}: src {s!r} is not a rank of this "
                                 f"communicator (0..{self.comm.world_size - 1})")
            if s == self.rank:
                raise ValueError(f"expect of request {rid!r}: src is this rank itself")
            _compatible(self.geometries[s], mine, f"expect of request {rid!r}", s, self.rank)
        if len(set(srcs)) != len(srcs):
            raise ValueError(f"expect of request {rid!r}: src {srcs} repeats a rank")

    # ---- prefill side -----------------------------------------------------------------------
    def push(self, request_id, dst: int, block_ids, layers=None,
             head_split: HeadSplit | tuple | None = None) -> "PushHandle":
        """Move request ``request_id``'s blocks ``block_ids`` (this rank's, in token order)
        into the blocks ``dst`` expects, for ``layers`` (a range; default all).

        ``head_split=(src_head, dst_head, count)``: heads ``[src_head, src_head+count)`` of
        this rank's cache go to heads ``[dst_head, ...)`` of ``dst``'s (different TP layouts);
        default: all heads, which needs equal ``kv_heads`` on both sides.

        Inside a host the data has landed when this returns. Across hosts it is on its way:
        ``handle.wait()`` before overwriting the source blocks (``close`` waits for all).
        """
        self._check_cache()
        self.poll()
        rid = request_key(request_id)
        mine = self.geometry
        try:
            if isinstance(dst, bool) or not isinstance(dst, int) or \
                    not 0 <= dst < self.comm.world_size or dst == self.rank:
                raise ValueError(f"push of request {rid!r}: dst {dst!r} must be another rank "
                                 f"of this communicator (0..{self.comm.world_size - 1})")
            theirs = self.geometries[dst]
            _compatible(mine, theirs, f"push of request {rid!r}", self.rank, dst)
            ids = check_block_ids(block_ids, mine, f"push of request {rid!r}")
            lo, hi = _layer_range(layers, mine.layers, rid)
            hs = _head_split(head_split, mine, theirs, rid, dst)
        except ValueError as e:
            if isinstance(dst, int) and 0 <= dst < self.comm.world_size and dst != self.rank:
                self._expects.pop((dst, rid), None)     # the receiver's handle fails too
                self._send(dst, Message(NOTICE, rid, (FAILED,),
                                        text=f"rank {self.rank}'s push of request {rid!r} "
                                             f"failed there: {e}"))
            raise
        ex = self._wait_expectation(dst, rid)
        problem = None
        if ex.nblocks != len(ids):
            problem = CommMismatch(f"request {rid!r}: rank {self.rank} pushes {len(ids)} "
                                   f"blocks, rank {dst} expects {ex.nblocks}")
        elif ex.pushed & set(range(lo, hi)):
            problem = ValueError(f"push of request {rid!r}: layers "
                                 f"{sorted(ex.pushed & set(range(lo, hi)))} were already pushed")
        if problem is not None:
            del self._expects[(dst, rid)]
            self._send(dst, Message(NOTICE, rid, (FAILED,), text=str(problem)))
            raise problem
        runs = coalesce(ids, ex.ids)
        moves = transfers(runs, range(lo, hi))
        ph = PushHandle(rid, dst, len(moves), 0, self)
        if dst in self._local:
            ph.nbytes = self._copy_local(dst, ex, moves, hs)
        else:
            self._send_remote(dst, rid, ex, ids, lo, hi, hs, moves, ph)
            self._pushes = [p for p in self._pushes if p.pending] + [ph]
        ex.pushed |= set(range(lo, hi))
        if len(ex.pushed) == mine.layers:
            del self._expects[(dst, rid)]
        return ph

    def _wait_expectation(self, dst: int, rid: str) -> "_Expectation":
        key = (dst, rid)
        deadline = time.monotonic() + self.timeout
        wait = _Backoff()
        while True:
            if key in self._rejected:
                raise CommMismatch(self._rejected.pop(key))
            ex = self._expects.get(key)
            if ex is not None:
                return ex
            if time.monotonic() > deadline:
                waiting = sorted(r for (d, r) in self._expects if d == dst)
                self._send(dst, Message(NOTICE, rid, (UNKNOWN,), text=(
                    f"rank {self.rank} pushed request {rid!r} to this rank, which never "
                    f"expected it (waited {self.timeout:g} s)")))
                raise CommTimeout(
                    f"push of request {rid!r} to rank {dst}: rank {dst} did not expect it "
                    f"within {self.timeout:g} s (requests it expects from rank {self.rank}: "
                    f"{waiting or 'none'})", collective="kv.push", missing=(dst,))
            wait()
            self.poll()

    def _peer_cache(self, r: int) -> torch.Tensor:
        t = self._peer_caches.get(r)
        if t is None:
            g = self.geometries[r]
            t = self.comm.peer(self._raw, r)[:g.nbytes].view(g.dtype).view(g.shape)
            self._peer_caches[r] = t
        return t

    def _copy_local(self, dst: int, ex: "_Expectation", moves, hs: HeadSplit) -> int:
        """Copy ``moves`` into ``dst``'s cache, storing each layer's flag after its data.

        Whole blocks move through numpy views of the two caches as bytes: a numpy slice
        assignment costs ~1 us of Python against ~6 us for torch's ``copy_`` (128 blocks of
        32 KB, fragmented: 0.16 ms against 0.84 ms, tests/kv measures neither -- bench kv
        does), and both are memcpy for the bytes."""
        board = self._peer_boards[dst]
        at = self._slots_at + ex.slot * self._slot_words + ex.j * (_SRC_HDR + self._l_max)
        board[at:at + 3] = (hs.src, hs.dst, hs.count)
        board[at + 3] += len(moves)
        whole = hs.is_whole(self.cache.shape[4], self.geometries[dst].kv_heads)
        if whole:
            src, out = self._blocks_np(self.rank), self._blocks_np(dst)
        else:
            src, out = self.cache, self._peer_cache(dst)
        nbytes, layer = 0, None
        for t in moves:
            if layer is not None and t.layer != layer:
                board[at + _SRC_HDR + layer] = ex.gen        # layer done: after its data
            layer = t.layer
            r = t.run
            a = src[t.layer, t.kv, r.src:r.src + r.n]
            b = out[t.layer, t.kv, r.dst:r.dst + r.n]
            if whole:
                b[...] = a
                nbytes += a.nbytes
            else:
                a = a[:, :, hs.src:hs.src + hs.count]
                b[:, :, hs.dst:hs.dst + hs.count].copy_(a)
                nbytes += a.numel() * a.element_size()
        if layer is not None:
            board[at + _SRC_HDR + layer] = ex.gen
        return nbytes

    def _blocks_np(self, r: int) -> np.ndarray:
        """Rank ``r``'s cache (this rank's or a host peer's) as uint8 ``[L, 2, B, block]``."""
        key = ("np", r)
        v = self._peer_caches.get(key)
        if v is None:
            g = self.geometries[r]
            raw = self._raw if r == self.rank else self.comm.peer(self._raw, r)
            v = raw.numpy()[:g.nbytes].reshape(g.layers, 2, g.blocks, g.block_bytes)
            self._peer_caches[key] = v
        return v

    def _send_remote(self, dst, rid, ex, ids, lo, hi, hs: HeadSplit, moves, ph) -> None:
        base = self._tags[dst]
        self._tags[dst] = (base + len(moves)) % TAG_SPAN
        self._send(dst, Message(PUSH, rid, (len(ids), ex.slot, ex.gen, ex.j, lo, hi, hs.src,
                                             hs.dst, hs.count, base, len(moves)),
                                ids=ids + ex.ids))
        whole = hs.is_whole(self.cache.shape[4], self.geometries[dst].kv_heads)
        for k, t in enumerate(moves):
            a = self.cache[t.layer, t.kv, t.run.src:t.run.src + t.run.n]
            if not whole:
                a = a[:, :, hs.src:hs.src + hs.count].contiguous()
            ph.pending += 1
            self._gloo.post_send(dst, _bytes(a), DATA_TAG0 + (base + k) % TAG_SPAN,
                                 (f"data of request {rid!r}", ph))
            ph.nbytes += a.numel() * a.element_size()

    # ---- progress ---------------------------------------------------------------------------
    def poll(self, block: float = 0.0) -> None:
        """Read control messages and finished transfers (every call does this; a rank that
        only waits on other work may call it to let its peers' requests proceed).
        ``block``: seconds to sleep waiting for news from another host when there is none."""
        self._check_open()
        if self.cache is None:
            return
        for src, m in self._shm.poll():
            self._on_message(src, m)
        if self._gloo is not None:
            for kind, peer, what in self._gloo.poll(block):
                if kind == "message":
                    self._on_message(peer, what)
                elif kind == "done":
                    self._on_done(what[1])
                else:
                    self._errors.append(CommTimeout(
                        f"kv on rank {self.rank}: the link to rank {peer} (another host) "
                        f"failed: the peer died or stopped ({what.splitlines()[0][:200]})",
                        collective="kv", missing=(peer,)))
        if self._errors:
            raise self._errors.pop(0)

    def _on_message(self, src: int, m: Message) -> None:
        if m.kind == EXPECT:
            nb, slot, gen, j, nsrc = m.args[:5]
            self._expects[(src, m.rid)] = _Expectation(slot, gen, j, nsrc, m.ids, nb)
        elif m.kind == PUSH:
            self._on_push(src, m)
        elif m.kind == NOTICE:
            code = m.args[0]
            if code == REJECTED:
                self._rejected[(src, m.rid)] = m.text
                self._expects.pop((src, m.rid), None)
                return
            h = self._handles.get(m.rid)
            if h is not None and src in h.srcs:
                h._fail(CommMismatch(m.text))
            elif code == UNKNOWN:
                self._errors.append(CommMismatch(m.text))
            else:
                self._early[(src, m.rid)] = m.text
        elif m.kind == CLOSE:
            self._closed_by.add(src)

    def _on_push(self, src: int, m: Message) -> None:
        nb, slot, gen, j, lo, hi, h_src, h_dst, h_count, base, n = m.args[:11]
        src_ids, dst_ids = m.ids[:nb], m.ids[nb:]
        moves = transfers(coalesce(src_ids, dst_ids), range(lo, hi))
        g_src = self.geometries[src]
        h = self._by_slot.get(slot)
        if h is None or h.gen != gen or h.error is not None or len(moves) != n or \
                j >= len(h.srcs) or h.srcs[j] != src or dst_ids != h.ids:
            h = None        # failed here already: receive and drop, so the sends complete
        else:
            h._heads[j] = (h_dst, h_count)
            h._remote_transfers += n
        whole = h is not None and HeadSplit(h_src, h_dst, h_count).is_whole(
            g_src.kv_heads, self.geometry.kv_heads)
        for k, t in enumerate(moves):
            into = None
            if whole:
                buf = self.cache[t.layer, t.kv, t.run.dst:t.run.dst + t.run.n]
            else:
                buf = torch.empty((t.run.n, g_src.block_size, h_count, g_src.head_dim),
                                  dtype=g_src.dtype)
                if h is not None:
                    into = self.cache[t.layer, t.kv, t.run.dst:t.run.dst + t.run.n,
                                      :, h_dst:h_dst + h_count]
            if h is not None:
                h._pending[(j, t.layer)] = h._pending.get((j, t.layer), 0) + 1
            rec = _Recv(buf, into, src, h, j, t.layer)
            self._recvs += 1
            self._gloo.post_recv(src, _bytes(buf), DATA_TAG0 + (base + k) % TAG_SPAN,
                                 (f"data of request {m.rid!r}", rec))

    def _on_done(self, token) -> None:
        """A data receive (``_Recv``) or send (``PushHandle``) across hosts completed."""
        if token is None:               # a control message went out
            return
        if isinstance(token, PushHandle):
            token.pending -= 1
            return
        r = token
        self._recvs -= 1
        h = r.handle
        if h is None or h.error is not None:
            return
        if r.into is not None:
            r.into.copy_(r.buf)
        key = (r.j, r.layer)
        h._pending[key] -= 1
        if not h._pending[key]:
            h._remote_done[r.j].add(r.layer)

    def _send(self, dst: int, m: Message) -> None:
        if dst in self._remote:
            self._gloo.send(dst, m)
            return
        deadline = time.monotonic() + self.timeout
        wait = _Backoff()
        while not self._shm.room(dst):
            if time.monotonic() > deadline:
                raise CommTimeout(f"kv: rank {dst} has not read its control messages from rank "
                                  f"{self.rank} for {self.timeout:g} s ({mb.KIND_NAMES[m.kind]} "
                                  f"of request {m.rid!r} waiting)", collective="kv",
                                  missing=(dst,))
            wait()
            self._drain_for_room()
        self._shm.send(dst, m)

    def _drain_for_room(self) -> None:
        for src, m in self._shm.poll():
            self._on_message(src, m)

    # ---- teardown ---------------------------------------------------------------------------
    def close(self) -> None:
        """Wait for this rank's pushes to finish and end the engine (every rank calls it when
        ranks span hosts: each tells the others it sends no more). The cache stays valid
        until the communicator closes; the engine drops its references to it and to its
        board, so both return to the heap once the caller drops ``cache``."""
        if self._closed:
            return
        try:
            for ph in self._pushes:
                ph.wait()
            if self._gloo is not None:
                for p in self._remote:
                    self._gloo.send(p, Message(CLOSE, "close"))
                deadline = time.monotonic() + self.timeout
                wait = _Backoff()
                while set(self._remote) - self._closed_by or self._recvs:
                    if time.monotonic() > deadline:
                        missing = tuple(sorted(set(self._remote) - self._closed_by))
                        raise CommTimeout(f"kv close on rank {self.rank}: rank(s) "
                                          f"{list(missing)} did not close within "
                                          f"{self.timeout:g} s", collective="kv.close",
                                          missing=missing)
                    wait()
                    self.poll()
        finally:
            self._closed = True
            # drop the symmetric tensors now (handles refer back to this object, so the
            # cycle collector would free them later, at a different moment on each rank, and
            # the next comm.alloc would find the heaps diverged)
            self._handles.clear()
            self._by_slot.clear()
            if self._gloo is not None:
                self._gloo.stop()
            self.cache = self._raw = self._board = self._board_np = None
            self._peer_caches.clear()
            self._peer_boards = {}
            self._shm = None

    def __enter__(self) -> "KVTransfer":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _check_open(self) -> None:
        if self._closed:
            raise mb.KVClosed("this KVTransfer is closed")

    def _check_cache(self) -> None:
        self._check_open()
        if self.cache is None:
            raise ValueError("call kv.paged_cache(...) on every rank first")


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
        self._remote_done = {j: set() for j, s in enumerate(srcs) if s in kv._remote}
        self._pending: dict[tuple[int, int], int] = {}
        self._heads: dict[int, tuple[int, int]] = {}
        self._at = kv._slots_at + slot * kv._slot_words
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
        a = self._at + j * (_SRC_HDR + self.kv._l_max)
        return self.kv._board_np[a:a + _SRC_HDR + self.layers]

    def _has(self, j: int, layer: int) -> bool:
        if j in self._remote_done:
            return layer in self._remote_done[j]
        return int(self._flag(j)[_SRC_HDR + layer]) == self.gen

    def _fail(self, e: Exception) -> None:
        if self.error is None and not self.complete:
            self.error = e
            self._release()

    def _release(self) -> None:
        kv = self.kv
        self._released = True
        if kv._handles.get(self.rid) is self:
            del kv._handles[self.rid]
            del kv._by_slot[self.slot]
            kv._free.append(self.slot)

    def _raise(self) -> None:
        if self.error is not None:
            raise type(self.error)(str(self.error))

    def cancel(self, reason: str = "cancelled") -> None:
        """Give the request up: its slot is freed and its senders are told, so a push of it
        that comes later raises on the sender instead of writing into blocks this rank may
        have handed to another request. (A push already copying cannot be stopped: reuse
        the blocks once the senders have been heard from, or after their timeout.)"""
        if self.complete or self.error is not None:
            return
        self._fail(CommMismatch(f"request {self.rid!r} was cancelled on rank {self.kv.rank}: "
                                f"{reason}"))
        for s in self.srcs:
            self.kv._send(s, Message(NOTICE, self.rid, (REJECTED,),
                                     text=f"rank {self.kv.rank} cancelled request "
                                          f"{self.rid!r}: {reason}"))

    def layer_ready(self, i: int) -> bool:
        """True once layer ``i`` of every sender has landed in this rank's cache."""
        if not 0 <= i < self.layers:
            raise ValueError(f"request {self.rid!r}: layer {i} out of range [0, {self.layers})")
        if self.complete:
            return True
        self.kv.poll()
        self._raise()
        return all(self._has(j, i) for j in range(len(self.srcs)))

    def done(self, _block: float = 0.0) -> bool:
        """True once every layer has landed (raises what went wrong, if anything did)."""
        if self.complete:
            return True
        self.kv.poll(_block)
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
        wait = _Backoff()
        # news from other hosts wakes a blocked poll; shared-memory flags need polling
        block = _BLOCK if all(s in self.kv._remote for s in self.srcs) else 0.0
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
        self._release()
        if problem:
            self.error = CommMismatch(f"request {self.rid!r} on rank {kv.rank}: the senders' "
                                      f"head splits {spans} do not tile the {geo.kv_heads} heads "
                                      f"here ({problem})")
            self._raise()
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

    def done(self, _block: float = 0.0) -> bool:
        """True once the data has left this rank's cache (at once inside a host)."""
        if self.pending and self.kv is not None:
            self.kv.poll(_block)
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


@dataclass
class _Expectation:
    """What a receiver told this sender about one request."""

    slot: int
    gen: int
    j: int
    nsrc: int
    ids: list
    nblocks: int
    pushed: set = field(default_factory=set)


@dataclass
class _Recv:
    """One inter-host data message on its way into this rank's cache (``handle`` None: a
    message of a request that failed here, received only to be dropped)."""

    buf: torch.Tensor
    into: torch.Tensor | None          # where a staged head split goes
    src: int
    handle: ExpectHandle | None
    j: int
    layer: int


def _bytes(t: torch.Tensor) -> torch.Tensor:
    return t.reshape(-1).view(torch.uint8)


def _compatible(src: CacheGeometry, dst: CacheGeometry, what: str, s: int, d: int) -> None:
    for name in ("layers", "block_size", "head_dim", "dtype"):
        a, b = getattr(src, name), getattr(dst, name)
        if a != b:
            raise ValueError(f"{what}: rank {s}'s cache and rank {d}'s differ in {name} "
                             f"({a} vs {b}); caches that exchange blocks must agree on layers, "
                             f"block_size, head_dim and dtype")


def _layer_range(layers, n: int, rid: str) -> tuple[int, int]:
    if layers is None:
        return 0, n
    ls = [int(x) for x in layers]
    if not ls or ls != list(range(ls[0], ls[0] + len(ls))) or ls[0] < 0 or ls[-1] >= n:
        raise ValueError(f"push of request {rid!r}: layers must be a non-empty range within "
                         f"[0, {n}), got {layers!r}")
    return ls[0], ls[-1] + 1


def _head_split(hs, mine: CacheGeometry, theirs: CacheGeometry, rid: str, dst: int) -> HeadSplit:
    if hs is None:
        if mine.kv_heads != theirs.kv_heads:
            raise ValueError(f"push of request {rid!r}: this rank has {mine.kv_heads} KV heads "
                             f"and rank {dst} has {theirs.kv_heads}; pass head_split=(src_head, "
                             f"dst_head, count) to say which heads go where")
        return HeadSplit.whole(mine.kv_heads)
    hs = hs if isinstance(hs, HeadSplit) else HeadSplit(*[int(x) for x in hs])
    if hs.count < 1 or hs.src < 0 or hs.dst < 0 or hs.src + hs.count > mine.kv_heads or \
            hs.dst + hs.count > theirs.kv_heads:
        raise ValueError(f"push of request {rid!r}: head_split {tuple(vars(hs).values())} does "
                         f"not fit {mine.kv_heads} heads here and {theirs.kv_heads} on rank {dst}")
    return hs


def _span(v: list[int]) -> str:
    return f"{v[0]}..{v[-1]}" if len(v) > 1 and v == list(range(v[0], v[-1] + 1)) else str(v)


class _Backoff:
    """Poll fast at first, then sleep longer (up to 1 ms) so a long wait leaves the core."""

    def __init__(self):
        self.n = 0

    def __call__(self) -> None:
        self.n += 1
        if self.n > 200:
            time.sleep(min(1e-3, 1e-5 * (self.n - 200)))
        elif self.n > 20:
            time.sleep(0)

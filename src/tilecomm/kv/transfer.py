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

import gc
import math
import operator
import time

import numpy as np
import torch

from ..errors import CommError, CommMismatch, CommTimeout
from . import mailbox as mb
from .mailbox import CLOSE, EXPECT, NOTICE, PUSH, Codec, Message, request_key
from .flags import DeviceFlags, HostFlags
from .handles import (DATA_TAG0, FAILED, REJECTED, STALLED, TAG_SPAN, UNKNOWN, Backoff, Board,
                      ExpectHandle, Expectation, KVStalled, PushHandle, Recv)
from . import prepost
from .paths import PATHS, PathChooser, copy_tiles
from .schedule import (GEOMETRY, CacheGeometry, HeadSplit, check_block_ids, coalesce,
                       request_bytes, transfers)

MAX_SOURCES = 8            # senders one request may gather heads from
_IDLE_OK = 7 * 24 * 3600.0  # Gloo timeout of the engine's group (see paged_cache)
_DEVICE_KINDS = {"cpu": 1, "cuda": 2}    # exchanged, so every rank sees a mismatch


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
        #: the request slots of the board (made with the cache)
        self.board: Board | None = None
        #: the layer flags (tilecomm.kv.flags), made with the cache
        self.flags: HostFlags | None = None
        #: the device heap the cache lives in (tilecomm.device.DeviceHeap: the shared-memory
        #: heap for CPU caches, the CUDA IPC heap for CUDA ones)
        self.heap = None
        #: path="auto"'s cost per path (tilecomm.kv.paths.PathChooser), made when first used
        self.chooser: PathChooser | None = None
        self.geometries: list[CacheGeometry] = []
        self._closed = False
        # receiver side
        self._handles: dict[str, ExpectHandle] = {}       # open requests by id
        self._by_slot: dict[int, ExpectHandle] = {}
        self._held: dict[int, ExpectHandle] = {}          # destination block -> its request
        self._inflight: set[ExpectHandle] = set()         # ended, receives still posted
        self._pre_tags: dict[int, int] = {}               # next posted-receive tag per sender
        self._next_expiry = float("inf")                  # earliest deadline of _handles
        self._gen = 0
        self._early: dict[tuple[int, str], str] = {}      # notices before the expect
        self._errors: list[Exception] = []                 # raised at the next call
        self._recvs: dict[int, int] = {}                   # inter-host receives in flight
        self._dead: dict[int, str] = {}                    # peers whose link failed
        self._outbox: dict[int, list] = {}                 # messages waiting for ring room
        # sender side
        self._expects: dict[tuple[int, str], Expectation] = {}
        self._rejected: dict[tuple[int, str], tuple[type, str]] = {}   # (error, text)
        self._pushes: list[PushHandle] = []
        self._tags: dict[int, int] = {}
        self._peer_caches: dict[int, torch.Tensor] = {}
        self._closed_by: set[int] = set()
        self._zeros: torch.Tensor | None = None     # what drains send (_drop_expectation)
        self._scratch = None                # what path="auto" times on (CUDA)
        #: kernels this engine ran in the Triton interpreter (CPU caches; see close)
        self.interpreted_launches = 0

    # ---- setup ------------------------------------------------------------------------------
    def paged_cache(self, *, num_layers: int, num_blocks: int, block_size: int, kv_heads: int,
                    head_dim: int, dtype: torch.dtype = torch.bfloat16,
                    device: str | torch.device = "cpu") -> torch.Tensor:
        """This rank's cache, zero-filled: ``[num_layers, 2, num_blocks, block_size, kv_heads,
        head_dim]`` (K and V per layer, vLLM's per-layer layout), in symmetric memory.

        ``device``: ``"cpu"`` (the shared-memory heap) or ``"cuda"`` / ``"cuda:N"`` (a CUDA
        IPC heap of its own, sized for the cache; default device ``cuda:rank %
        device_count``); every rank must name the same kind. ``dtype``: any of
        :data:`tilecomm.kv.schedule.CACHE_DTYPES` (fp8 included: the engine moves bytes).

        Collective: every rank calls it once; geometries may differ between ranks (prefill and
        decode may use different tensor-parallel layouts: ``kv_heads`` is this rank's share).
        """
        from ..device.heap import DeviceHeap, interpreted

        self._check_open()
        if self.cache is not None:
            raise ValueError("paged_cache: this KVTransfer already has its cache")
        dev = torch.device(device)
        if dev.type not in _DEVICE_KINDS:
            raise ValueError(f"paged_cache: device {str(device)!r} is not supported; use 'cpu' "
                             f"or 'cuda' (the KV engine's caches live in symmetric memory)")
        if dev.type == "cuda" and interpreted():
            raise ValueError("paged_cache: device='cuda' under TRITON_INTERPRET=1, which runs "
                             "kernels on CPU tensors; use device='cpu' caches there")
        g = CacheGeometry(num_layers, num_blocks, block_size, kv_heads, head_dim, dtype)
        rows = self.comm.exchange(g.words() + [self.max_requests, self.ring_slots,
                                               _DEVICE_KINDS[dev.type]])
        n = len(GEOMETRY)
        kinds = {r[n + 2] for r in rows}
        if len(kinds) > 1:
            names = {v: k for k, v in _DEVICE_KINDS.items()}
            where = ", ".join(f"rank {i}: {names[r[n + 2]]}" for i, r in enumerate(rows))
            raise ValueError(f"paged_cache: every rank's cache must be on the same kind of "
                             f"device ({where})")
        self.geometries = [CacheGeometry.from_words(r[:n]) for r in rows]
        self.max_requests = max(r[n] for r in rows)          # the largest any rank asked for
        self.ring_slots = max(r[n + 1] for r in rows)
        lay = self.comm.layout
        max_bytes = max(x.nbytes for x in self.geometries)
        self._l_max = max(x.layers for x in self.geometries)
        self._codec = Codec(max(x.blocks for x in self.geometries))
        flag_words = Board.words_for(self.max_requests, self._l_max, MAX_SOURCES)
        # the device heap spans this host's ranks (kernels and copies reach no other host);
        # CPU caches come from the communicator's own allocator, which the heap shares
        self.heap = DeviceHeap.create(
            self.comm.host_comm, device=dev,
            nbytes=_round_up(max_bytes, 1 << 20) + _round_up(8 * flag_words, 1 << 20) + (4 << 20))
        self._raw = self.heap.alloc(max_bytes, torch.uint8) if dev.type == "cuda" else \
            self.comm.alloc(max_bytes, torch.uint8)
        self.cache = self._raw[:g.nbytes].view(dtype).view(g.shape)
        host = lay.hosts[lay.host_of(self.rank)]
        self._local = [r for r in host if r != self.rank]
        self._remote = [r for r in range(self.comm.world_size) if r not in host]
        ring_words = mb.ShmMailbox.board_words(self._codec, lay.max_local, self.ring_slots)
        self._board = self.comm.alloc(ring_words + flag_words, torch.int64)
        self._board_np = self._board.numpy()
        #: the request slots of the board (the same layout on every rank of the host)
        self.board = Board(self._board_np, ring_words, self._l_max, MAX_SOURCES)
        self._peer_boards = {r: self.comm.peer(self._board, r).numpy() for r in self._local}
        if dev.type == "cuda":
            self.flags = DeviceFlags(self.board, self.heap.signal_pad(flag_words), self.heap,
                                     {r: lay.local_rank(r) for r in self._local})
        else:
            self.flags = HostFlags(self.board, self._board[ring_words:], self._peer_boards)
            self.chooser = PathChooser()
        self._shm = mb.ShmMailbox(
            self._codec, self._board, {r: self.comm.peer(self._board, r) for r in self._local},
            lay.local_rank(self.rank), {r: lay.local_rank(r) for r in self._local},
            self.ring_slots, 0)
        self._free = list(range(self.max_requests))[::-1]
        # the engine bounds every wait itself; Gloo's own timeout would fire on an idle peer.
        # Control messages always go through Gloo; the data of CUDA caches through NCCL.
        self._gloo = None
        if lay.num_hosts > 1:
            self._gloo = mb.GlooMailbox(
                self._codec, self.comm.process_group("kv-control", timeout=_IDLE_OK),
                self.comm.process_group("kv-data", timeout=_IDLE_OK, device=dev.type),
                self._remote, device=self.cache.device)
        self._tags = {r: 0 for r in self._remote}
        return self.cache

    # ---- what the handles use ----------------------------------------------------------------
    def is_remote(self, rank: int) -> bool:
        """Whether ``rank`` is on another host (its data arrives by message)."""
        return rank in self._remote

    def release(self, h: ExpectHandle) -> None:
        """Free ``h``'s slot (its request is complete or failed): the board word goes to 0
        first, so local senders stop writing into blocks this rank may give to another."""
        if self._handles.get(h.rid) is h:
            self._board_np[self.board.slot_at(h.slot)] = 0
            del self._handles[h.rid]
            del self._by_slot[h.slot]
            self._free.append(h.slot)
            if h.inflight:              # its posted receives may still write its blocks
                self._inflight.add(h)
            else:
                self._unhold(h)

    def await_landing(self, h: ExpectHandle, limit: float) -> None:
        """Make progress until the receives posted for ``h`` at its expect have landed, for
        at most ``limit`` seconds (then its blocks stay held until they do)."""
        end = time.monotonic() + limit
        while h.inflight and not self._closed and time.monotonic() < end:
            self.progress(0.01)

    def _unhold(self, h: ExpectHandle) -> None:
        self._inflight.discard(h)
        for b in h.ids:
            if self._held.get(b) is h:
                del self._held[b]

    @property
    def geometry(self) -> CacheGeometry:
        self._check_cache()
        return self.geometries[self.rank]

    # ---- decode side ------------------------------------------------------------------------
    def expect(self, request_id, src, block_ids, *, deadline: float | None = None
               ) -> "ExpectHandle":
        """Announce where request ``request_id``'s blocks must land in this rank's cache.

        ``src``: the prefill rank that pushes it, or a list of ranks when this rank's heads
        come from several (each pushes its heads with ``head_split``). ``block_ids``: this
        rank's blocks, in token order; a block that a request still in flight holds is
        refused (``ValueError`` naming it and the request). ``deadline``: seconds the whole
        request may take from now (default: the engine's timeout); once it passes with
        layers missing the request ends on both sides (:class:`~tilecomm.kv.KVStalled`,
        ``state == "stalled"``) and its blocks are free again (with receives posted at expect,
        once the data still owed has landed: kv/prepost.py). Returns at once; the handle
        tells when layers land.
        """
        self._check_cache()
        self.poll()
        rid = request_key(request_id)
        srcs = _ranks(src)
        if rid in self._handles:    # not told to the senders: the request in flight is fine
            raise ValueError(f"expect: request {rid!r} is already expected here (from "
                             f"rank(s) {self._handles[rid].srcs}); ids must be unique among "
                             f"requests in flight")
        for s in srcs:
            if s in self._dead:
                raise self._dead_error(s, f"expect of request {rid!r}")
        try:
            limit = self.timeout if deadline is None else float(deadline)
            if not limit > 0 or math.isinf(limit):
                raise ValueError(f"expect of request {rid!r}: deadline must be a finite number "
                                 f"of seconds > 0, got {deadline!r}")
            self._check_sources(srcs, rid)
            ids = check_block_ids(block_ids, self.geometry, f"expect of request {rid!r}")
            self._check_free(ids, rid)
            if not self._free:
                raise ValueError(f"expect: {self.max_requests} requests are already in flight "
                                 f"on rank {self.rank}; wait for some, or make the KVTransfer "
                                 f"with a larger max_requests")
        except ValueError as e:
            for s in srcs:
                if isinstance(s, int) and 0 <= s < self.comm.world_size and s != self.rank:
                    self.send_control(s, Message(NOTICE, rid, (REJECTED, 0),
                                          text=f"rank {self.rank} rejected request {rid!r}: "
                                               f"{e}"))
            raise
        for s in srcs:      # after the checks: a bad expect says what was wrong with it
            if s in self._closed_by:
                raise mb.KVClosed(f"expect of request {rid!r}: rank {s} has closed its "
                                  f"KVTransfer; it sends no more")
        slot = self._free.pop()
        self._gen += 1
        h = ExpectHandle(self, rid, srcs, ids, slot, self._gen, limit)
        at = self.board.slot_at(slot)
        self._board_np[at:at + self.board.slot_words] = 0
        self._board_np[at] = h.gen          # live: senders check it before each layer
        self._handles[rid] = self._by_slot[slot] = h
        self._held.update(dict.fromkeys(ids, h))
        self._next_expiry = min(self._next_expiry, h.expires)
        ms = max(1, int(limit * 1000))
        pre = self._prepost(h) if len(srcs) == 1 and self.is_remote(srcs[0]) and \
            not self.cache.is_cuda else -1
        for j, s in enumerate(srcs):
            self.send_control(s, Message(EXPECT, rid, (len(ids), slot, h.gen, j, len(srcs), ms,
                                                       pre), ids=ids))
        for j, s in enumerate(srcs):
            text = self._early.pop((s, rid), None)
            if text is not None:
                h.fail(CommMismatch(text))
        return h

    def _prepost(self, h: ExpectHandle) -> int:
        """Post every receive of ``h`` (one sender, on another host) now; returns the tag
        base the sender must use (NOTE [receives posted at expect], kv/prepost.py)."""
        src, geo = h.srcs[0], self.geometry
        runs = prepost.dst_runs(h.ids)
        n = prepost.messages(geo.layers, len(runs))
        base = self._pre_tags.get(src, 0)
        self._pre_tags[src] = (base + n) % prepost.PREPOST_SPAN
        h.remote_push(0, 0, geo.kv_heads, n)
        h.inflight = n
        h.committed = set()
        for layer in range(geo.layers):
            for kv in (0, 1):
                for k, r in enumerate(runs):
                    buf = self.cache[layer, kv, r.dst:r.dst + r.n]
                    h.remote_transfer_expected(0, layer)
                    self._gloo.post_recv(src, _bytes(buf),
                                         prepost.tag(base, layer, kv, len(runs), k),
                                         (f"data of request {h.rid!r}",
                                          Recv(buf, None, src, h, 0, layer)))
        self._recvs[src] = self._recvs.get(src, 0) + n
        return base

    def _check_free(self, ids: list[int], rid: str) -> None:
        """ValueError if a request in flight holds any of ``ids`` (a block manager that hands
        a block to two requests would have the second one's data land in the first's)."""
        taken = [b for b in ids if b in self._held]
        if taken:
            by: dict[str, list[int]] = {}
            for b in taken:
                by.setdefault(self._held[b].rid, []).append(b)
            ended = {h.rid for h in self._inflight}
            shown = "; ".join(f"block(s) {v} by request {r!r}" +
                              (" (ended, its data still on its way)" if r in ended else "")
                              for r, v in by.items())
            raise ValueError(f"expect of request {rid!r}: destination blocks are held by "
                             f"requests still in flight on rank {self.rank} ({shown}); wait "
                             f"for or cancel those first")

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
             head_split: HeadSplit | tuple | None = None, *, path: str = "auto"
             ) -> "PushHandle":
        """Move request ``request_id``'s blocks ``block_ids`` (this rank's, in token order)
        into the blocks ``dst`` expects, for ``layers`` (a range; default all).

        ``head_split=(src_head, dst_head, count)``: heads ``[src_head, src_head+count)`` of
        this rank's cache go to heads ``[dst_head, ...)`` of ``dst``'s (different TP layouts);
        default: all heads, which needs equal ``kv_heads`` on both sides.

        ``path`` (inside a host; :mod:`tilecomm.kv.paths`): ``"kernel"`` (one Triton launch;
        on CPU caches the interpreter), ``"copy_engine"`` (a copy per transfer: device to
        device on CUDA, memcpy on CPU) or ``"auto"`` (the one predicted faster on this
        device). ``handle.path`` says which ran (``"message"`` across hosts).

        Inside a host, CPU caches: the data has landed when this returns; CUDA caches: the
        copies are queued on the current stream (after the work that wrote the blocks), and
        the receiver sees each layer once it landed. Across hosts it is on its way.
        ``handle.wait()`` before overwriting the source blocks (``close`` waits for all).
        """
        self._check_cache()
        self.progress()
        rid = request_key(request_id)
        mine = self.geometry
        given, dst = dst, _rank(dst)
        if dst in self._dead:
            raise self._dead_error(dst, f"push of request {rid!r}")
        try:
            if dst is None or not 0 <= dst < self.comm.world_size or dst == self.rank:
                raise ValueError(f"push of request {rid!r}: dst {given!r} must be another rank "
                                 f"of this communicator (0..{self.comm.world_size - 1})")
            theirs = self.geometries[dst]
            _compatible(mine, theirs, f"push of request {rid!r}", self.rank, dst)
            ids = check_block_ids(block_ids, mine, f"push of request {rid!r}")
            lo, hi = _layer_range(layers, mine.layers, rid)
            hs = _head_split(head_split, mine, theirs, rid, dst)
            if path not in PATHS + ("auto",):
                raise ValueError(f"push of request {rid!r}: path must be one of "
                                 f"{', '.join(PATHS + ('auto',))}, got {path!r}")
        except ValueError as e:
            if isinstance(dst, int) and 0 <= dst < self.comm.world_size and dst != self.rank:
                self._drop_expectation(dst, rid)        # the receiver's handle fails too
                self.send_control(dst, Message(NOTICE, rid, (FAILED, 0),
                                        text=f"rank {self.rank}'s push of request {rid!r} "
                                             f"failed there: {e}"))
            raise
        ex = self._wait_expectation(dst, rid)
        problem = None
        if ex.nblocks != len(ids):
            problem = CommMismatch(f"request {rid!r}: rank {self.rank} pushes {len(ids)} "
                                   f"block(s), rank {dst} expects {ex.nblocks}")
        elif ex.nsrc == 1 and hs.count != theirs.kv_heads:
            problem = ValueError(f"push of request {rid!r}: rank {dst} expects all its "
                                 f"{theirs.kv_heads} heads from this rank alone, but head_split "
                                 f"sends {hs.count}")
        elif ex.pushed & set(range(lo, hi)):
            problem = ValueError(f"push of request {rid!r}: layers "
                                 f"{sorted(ex.pushed & set(range(lo, hi)))} were already pushed")
        elif time.monotonic() > ex.expires:
            problem = KVStalled(f"kv: push of request {rid!r} (layers {lo}..{hi - 1}) to rank "
                                f"{dst}: the request's deadline passed before the push; it "
                                f"has ended on both sides", collective="kv.push",
                                missing=(dst,))
        if problem is not None:
            self._drop_expectation(dst, rid)
            code = STALLED if isinstance(problem, KVStalled) else FAILED
            self.send_control(dst, Message(NOTICE, rid, (code, ex.gen), text=str(problem)))
            raise problem
        ph = PushHandle(rid, dst, 0, request_bytes(mine, len(ids), hi - lo, hs.count), self,
                        layers=range(lo, hi), expires=ex.expires)
        if dst in self._local or ex.pre < 0:
            moves = transfers(coalesce(ids, ex.ids), range(lo, hi))
            ph.transfers = len(moves)
        if dst in self._local:
            whole = hs.is_whole(mine.kv_heads, theirs.kv_heads)
            if path == "auto":
                path = self._choose(len(moves), ph.nbytes)
            ph.path = path
            if path == "kernel":
                self._kernel_local(dst, ex, moves, hs, whole, lo, hi)
            else:
                self._copy_local(dst, ex, moves, hs, whole)
            if self.cache.is_cuda:
                ph.event = torch.cuda.Event()
                ph.event.record()
                self._pushes = [p for p in self._pushes if p.event is not None or p.pending] \
                    + [ph]
        else:
            ph.path = "message"
            if ex.pre >= 0:
                self._send_preposted(dst, rid, ex, ids, lo, hi, hs, ph)
            else:
                self._send_remote(dst, rid, ex, ids, lo, hi, hs, moves, ph)
            self._pushes = [p for p in self._pushes if p.pending] + [ph]
        ex.pushed |= set(range(lo, hi))
        if len(ex.pushed) == mine.layers:
            del self._expects[(dst, rid)]
        return ph

    def _wait_expectation(self, dst: int, rid: str) -> "Expectation":
        key = (dst, rid)
        deadline = time.monotonic() + self.timeout
        wait = Backoff()
        while True:
            ex = self._expects.get(key)
            if ex is not None:
                return ex
            if key in self._rejected:
                err, text = self._rejected.pop(key)
                if err is KVStalled:
                    raise KVStalled(text, collective="kv.push", missing=(dst,))
                raise CommMismatch(text)
            if dst in self._dead:
                raise self._dead_error(dst, f"push of request {rid!r}")
            if time.monotonic() > deadline:
                waiting = sorted(r for (d, r) in self._expects if d == dst)
                self.send_control(dst, Message(NOTICE, rid, (UNKNOWN, 0), text=(
                    f"rank {self.rank} pushed request {rid!r} to this rank, which never "
                    f"expected it (waited {self.timeout:g} s)")))
                raise CommTimeout(
                    f"push of request {rid!r} to rank {dst}: rank {dst} did not expect it "
                    f"within {self.timeout:g} s (requests it expects from rank {self.rank}: "
                    f"{waiting or 'none'})", collective="kv.push", missing=(dst,))
            wait()
            self.progress()

    def _peer_raw(self, r: int) -> torch.Tensor:
        """Rank ``r``'s (this host) symmetric cache buffer as this process maps it."""
        if r == self.rank:
            return self._raw
        return self.heap.peer_view(self._raw, self.comm.layout.local_rank(r))

    def _peer_cache(self, r: int) -> torch.Tensor:
        t = self._peer_caches.get(r)
        if t is None:
            g = self.geometries[r]
            t = self._peer_raw(r)[:g.nbytes].view(g.dtype).view(g.shape)
            self._peer_caches[r] = t
        return t

    def _start_local(self, dst: int, ex: "Expectation", hs: HeadSplit) -> None:
        """Before a local push writes: raise if the receiver gave the request up, and record
        the sender's heads in its slot (the receiver reads them once every layer landed)."""
        board = self._peer_boards[dst]          # laid out as this rank's (self.board)
        if int(board[self.board.slot_at(ex.slot)]) != ex.gen:
            raise self._given_up(dst, ex.rid)
        at = self.board.sender_at(ex.slot, ex.j)
        board[at:at + 3] = (hs.src, hs.dst, hs.count)

    def _given_up(self, dst: int, rid: str) -> CommError:
        """The error of a local push that found its request given up on ``dst``: what
        ``dst`` said of it (its notice is in this rank's ring by then), KVStalled for a
        deadline."""
        self._expects.pop((dst, rid), None)
        self.progress()
        err, text = self._rejected.pop((dst, rid), (CommMismatch, (
            f"push of request {rid!r}: rank {dst} gave up the request (cancelled, failed or "
            f"stalled there)")))
        if err is KVStalled:
            return KVStalled(text, collective="kv.push", missing=(dst,))
        return err(text)

    def _copy_local(self, dst: int, ex: "Expectation", moves, hs: HeadSplit,
                    whole: bool) -> None:
        """Copy ``moves`` into ``dst``'s cache, storing each layer's flag after its data (the
        ``copy_engine`` path; on CUDA caches the copies and flags are queued on the current
        stream).

        Whole blocks of CPU caches move through numpy views of the two caches as bytes: a
        numpy slice assignment costs ~1 us of Python against ~6 us for torch's ``copy_``
        (128 blocks of 32 KB, fragmented: 0.16 ms against 0.84 ms, tests/kv measures neither
        -- bench kv does), and both are memcpy for the bytes."""
        self._start_local(dst, ex, hs)
        board = self._peer_boards[dst]
        slot_at = self.board.slot_at(ex.slot)
        if whole and not self.cache.is_cuda:
            src, out = self._blocks_np(self.rank), self._blocks_np(dst)
        else:
            src, out = self.cache, self._peer_cache(dst)
        layer = None
        for t in moves:
            if t.layer != layer:
                if layer is not None:            # layer done: its flag after its data
                    self.flags.set_peer(dst, ex.slot, ex.j, layer, ex.gen)
                    if int(board[slot_at]) != ex.gen:    # the receiver gave it up
                        raise self._given_up(dst, ex.rid)
            layer = t.layer
            r = t.run
            a = src[t.layer, t.kv, r.src:r.src + r.n]
            b = out[t.layer, t.kv, r.dst:r.dst + r.n]
            if whole:
                b[...] = a
            else:
                b[:, :, hs.dst:hs.dst + hs.count].copy_(a[:, :, hs.src:hs.src + hs.count])
        if layer is not None:
            self.flags.set_peer(dst, ex.slot, ex.j, layer, ex.gen)
        board[self.board.sender_at(ex.slot, ex.j) + 3] += len(moves)

    def _kernel_local(self, dst: int, ex: "Expectation", moves, hs: HeadSplit, whole: bool,
                      lo: int, hi: int) -> None:
        """The ``kernel`` path: one launch of the copy kernel for the whole push (it sets each
        layer's flag after the layer's data; NOTE [layer flag] in kv/kernel.py)."""
        if not self.cache.is_cuda:
            from ..device.heap import require_interpreter
            require_interpreter("kv push(path='kernel') on CPU caches")
        from .kernel import launch_copy

        self._start_local(dst, ex, hs)
        mine, theirs = self.geometry, self.geometries[dst]
        flag_at = [self.flags.index(ex.slot, ex.j, layer) for layer in range(lo, hi)]
        ct = copy_tiles(moves, mine, theirs, hs, lo, flag_at, whole, self._raw.numel())
        dev = self.cache.device
        table = torch.from_numpy(ct.table)
        if dev.type == "cuda":
            table = table.pin_memory().to(dev, non_blocking=True)
        counts = torch.zeros(ct.nlayers, dtype=torch.int32, device=dev)
        words = self._raw.view({4: torch.int32, 2: torch.int16, 1: torch.int8}[ct.word_bytes])
        launch_copy(ct, words, words, self.flags.tensor, table, counts, ex.gen,
                    self.comm.layout.local_rank(dst), self.heap.handle)
        self.interpreted_launches += not self.cache.is_cuda
        board = self._peer_boards[dst]
        board[self.board.sender_at(ex.slot, ex.j) + 3] += len(moves)

    def _choose(self, transfers: int, nbytes: int) -> str:
        """``path="auto"``: the path :class:`PathChooser` predicts faster for a push of
        ``transfers`` moves of ``nbytes`` in all."""
        if self.chooser is None:
            from .paths import measure_cuda
            self.chooser = measure_cuda(self._calibration_push, self.cache.device)
        return self.chooser.choose(transfers, nbytes)

    def _calibration_push(self, path: str, pieces: int, nbytes: int) -> None:
        """One push-like copy of ``nbytes`` in ``pieces`` transfers between two scratch
        buffers of this rank's device (for :func:`tilecomm.kv.paths.measure_cuda`)."""
        from .kernel import copy_pieces

        scratch = self._scratch
        if scratch is None:
            scratch = self._scratch = (torch.empty(16 << 20, dtype=torch.uint8,
                                                   device=self.cache.device),
                                       torch.empty(16 << 20, dtype=torch.uint8,
                                                   device=self.cache.device),
                                       torch.zeros(1, dtype=torch.int64,
                                                   device=self.cache.device))
        a, b, flag = scratch
        copy_pieces(path, a, b, flag, pieces, nbytes, self.comm.layout.local_rank(self.rank),
                    self.heap.handle)

    def _blocks_np(self, r: int) -> np.ndarray:
        """Rank ``r``'s cache (this rank's or a host peer's) as uint8 ``[L, 2, B, block]``."""
        key = ("np", r)
        v = self._peer_caches.get(key)
        if v is None:
            g = self.geometries[r]
            v = self._peer_raw(r).numpy()[:g.nbytes].reshape(g.layers, 2, g.blocks,
                                                             g.block_bytes)
            self._peer_caches[key] = v
        return v

    def _send_preposted(self, dst, rid, ex, ids, lo, hi, hs: HeadSplit, ph) -> None:
        """The messages of ``layers lo..hi-1`` of a request whose receives were posted at
        its expect, in the receiver's layout and tags (NOTE [receives posted at expect])."""
        # the layers' data counts on the receiver only with this word (a PUSH with no tag
        # base): what a sender that failed still sends lands without it
        self.send_control(dst, Message(PUSH, rid, (0, ex.slot, ex.gen, ex.j, lo, hi, hs.src,
                                                   hs.dst, hs.count, -1, 0)))
        whole = hs.is_whole(self.cache.shape[4], self.geometries[dst].kv_heads)
        key = tuple(ids)
        if ex.plan is None or ex.plan[0] != key:     # the same ids for every layer's push
            ex.plan = (key, prepost.Plan(ids, ex.ids))
        plan = ex.plan[1]
        nruns = len(plan.spans)
        ph.transfers = 0
        for layer, kv, k, a in plan.pieces(self.cache, range(lo, hi), hs, whole):
            ph.pending += 1
            ph.transfers += 1
            self._gloo.post_send(dst, _bytes(a), prepost.tag(ex.pre, layer, kv, nruns, k),
                                 (f"data of request {rid!r}", ph))

    def _drop_expectation(self, dst: int, rid: str) -> None:
        """Forget what ``dst`` expects of request ``rid``; for a request whose receives were
        posted at expect, send the layers not pushed yet as zeros, so every posted receive
        completes and ``dst`` can free the blocks (NOTE [receives posted at expect])."""
        ex = self._expects.pop((dst, rid), None)
        if ex is None or ex.pre < 0 or dst in self._dead:
            return
        dst_geo = self.geometries[dst]
        sizes = prepost.run_bytes(dst_geo, ex.ids)
        if self._zeros is None or self._zeros.numel() < max(sizes):
            self._zeros = torch.zeros(max(sizes), dtype=torch.uint8)
        ph = PushHandle(rid, dst, 0, 0, self, path="message")
        for layer in range(dst_geo.layers):
            if layer in ex.pushed:
                continue
            for kv in (0, 1):
                for k, n in enumerate(sizes):
                    ph.pending += 1
                    self._gloo.post_send(dst, self._zeros[:n],
                                         prepost.tag(ex.pre, layer, kv, len(sizes), k),
                                         (f"the rest of request {rid!r}", ph))
        self._pushes = [p for p in self._pushes if p.pending] + [ph]

    def _send_remote(self, dst, rid, ex, ids, lo, hi, hs: HeadSplit, moves, ph) -> None:
        """PUSH, then one message per transfer on the data group (Gloo for CPU caches, NCCL
        for CUDA ones: posted on this thread, so the send waits for the work queued on the
        current stream before it, as every NCCL call does)."""
        base = self._tags[dst]
        self._tags[dst] = (base + len(moves)) % TAG_SPAN
        self.send_control(dst, Message(PUSH, rid, (len(ids), ex.slot, ex.gen, ex.j, lo, hi, hs.src,
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

    # ---- progress ---------------------------------------------------------------------------
    def poll(self, block: float = 0.0) -> None:
        """Read control messages and finished transfers (every call does this; a rank that
        only waits on other work may call it to let its peers' requests proceed), and raise
        what concerns no request of this rank: a push of a request it never expected.
        ``block``: seconds to sleep waiting for news from another host when there is none."""
        self.progress(block)
        if self._errors:
            raise self._errors.pop(0)

    def progress(self, block: float = 0.0) -> None:
        """:meth:`poll` without raising the stray errors (handle methods raise their own)."""
        self._check_open()
        if self.cache is None:
            return
        self.flags.refresh()
        if time.monotonic() >= self._next_expiry:
            self._expire()
        self._flush_outbox()
        for src, m in self._shm.poll():
            self._on_message(src, m)
        if self._gloo is not None:
            for kind, peer, what in self._gloo.poll(block):
                if kind == "message":
                    self._on_message(peer, what)
                elif kind == "done":
                    self._on_done(what[1])
                else:
                    self._peer_died(peer, what)

    def _expire(self) -> None:
        """End the requests whose deadline passed (:meth:`ExpectHandle.stall`: here and, by
        notice, at their senders)."""
        now = time.monotonic()
        self._next_expiry = float("inf")
        for h in [h for h in self._handles.values() if h.expires <= now]:
            try:
                if h.settle():       # one that has just completed is not stalled
                    continue
            except CommError:        # it failed now; its owner hears of it from the handle
                continue
            h.stall()
        self._next_expiry = min((h.expires for h in self._handles.values()),
                                default=float("inf"))

    def _peer_died(self, peer: int, text: str) -> None:
        """A link to another host failed: everything that involves ``peer`` fails, naming it
        and the request; calls that do not involve it go on."""
        if peer in self._dead:
            return
        self._dead[peer] = text.splitlines()[0][:200] if text else "connection lost"
        for h in [h for h in self._handles.values() if peer in h.srcs]:
            h.fail(self._dead_error(peer, f"request {h.rid!r} (expect #{h.gen} on rank "
                                           f"{self.rank})"))
        for ph in self._pushes:
            if ph.dst == peer and ph.pending:
                ph.error = self._dead_error(peer, f"push of request {ph.rid!r}")
                ph.pending = 0
        self._recvs.pop(peer, None)
        self._expects = {k: v for k, v in self._expects.items() if k[0] != peer}
        for h in [h for h in self._inflight if h.srcs[0] == peer]:
            h.inflight = 0              # its receives failed with the link: nothing lands
            self._unhold(h)

    def _dead_error(self, peer: int, what: str) -> CommTimeout:
        return CommTimeout(f"kv: {what}: rank {peer} (another host) died or stopped: its link "
                           f"to rank {self.rank} failed ({self._dead[peer]})", collective="kv",
                           missing=(peer,))

    def _on_message(self, src: int, m: Message) -> None:
        if m.kind == EXPECT:
            nb, slot, gen, j, nsrc, ms, pre = m.args[:7]
            self._expects[(src, m.rid)] = Expectation(m.rid, slot, gen, j, nsrc, m.ids, nb,
                                                      time.monotonic() + ms / 1000, pre)
            self._rejected.pop((src, m.rid), None)      # a new expectation: old news is void
        elif m.kind == PUSH:
            self._on_push(src, m)
        elif m.kind == NOTICE:
            code, gen = m.args[:2]
            if code in (REJECTED, STALLED):   # the receiver refused or gave up (gen 0: no slot)
                ex = self._expects.get((src, m.rid))
                if ex is not None and (gen == 0 or ex.gen == gen):
                    self._drop_expectation(src, m.rid)
                err = KVStalled if code == STALLED else CommMismatch
                self._rejected[(src, m.rid)] = (err, m.text)
                for ph in self._pushes:      # a push still on its way ends too
                    if ph.dst == src and ph.rid == m.rid and ph.error is None and \
                            (ph.pending or ph.event is not None):
                        ph.error = err(m.text) if err is CommMismatch else \
                            KVStalled(m.text, collective="kv.push", missing=(src,))
                return
            h = self._handles.get(m.rid)
            if h is not None and src in h.srcs and gen in (0, h.gen):
                h.fail(CommMismatch(m.text))      # and its other senders are told
            elif code == UNKNOWN:
                self._errors.append(CommMismatch(m.text))
            else:
                self._early[(src, m.rid)] = m.text
        elif m.kind == CLOSE:
            self._closed_by.add(src)

    def _on_push(self, src: int, m: Message) -> None:
        nb, slot, gen, j, lo, hi, h_src, h_dst, h_count, base, n = m.args[:11]
        if base < 0:                    # layers of a request whose receives are posted
            h = self._by_slot.get(slot)
            if h is not None and h.gen == gen and h.error is None and h.committed is not None:
                h.commit(j, range(lo, hi))
            return
        src_ids, dst_ids = m.ids[:nb], m.ids[nb:]
        moves = transfers(coalesce(src_ids, dst_ids), range(lo, hi))
        g_src = self.geometries[src]
        h = self._by_slot.get(slot)
        if h is None or h.gen != gen or h.error is not None or len(moves) != n or \
                j >= len(h.srcs) or h.srcs[j] != src or dst_ids != h.ids:
            h = None        # failed here already: receive and drop, so the sends complete
        else:
            h.remote_push(j, h_dst, h_count, n)
        whole = h is not None and HeadSplit(h_src, h_dst, h_count).is_whole(
            g_src.kv_heads, self.geometry.kv_heads)
        for k, t in enumerate(moves):
            into = None
            if whole:
                buf = self.cache[t.layer, t.kv, t.run.dst:t.run.dst + t.run.n]
            else:
                buf = torch.empty((t.run.n, g_src.block_size, h_count, g_src.head_dim),
                                  dtype=g_src.dtype, device=self.cache.device)
                if h is not None:
                    into = self.cache[t.layer, t.kv, t.run.dst:t.run.dst + t.run.n,
                                      :, h_dst:h_dst + h_count]
            if h is not None:
                h.remote_transfer_expected(j, t.layer)
            rec = Recv(buf, into, src, h, j, t.layer)
            self._recvs[src] = self._recvs.get(src, 0) + 1
            self._gloo.post_recv(src, _bytes(buf), DATA_TAG0 + (base + k) % TAG_SPAN,
                                 (f"data of request {m.rid!r}", rec))

    def _on_done(self, token) -> None:
        """A data receive (``Recv``) or send (``PushHandle``) across hosts completed."""
        if token is None:               # a control message went out
            return
        if isinstance(token, PushHandle):
            token.pending = max(0, token.pending - 1)
            return
        r = token
        if r.src in self._dead:
            return
        self._recvs[r.src] -= 1
        h = r.handle
        if h is None:
            return
        if h.inflight:
            h.inflight -= 1
            if not h.inflight and h in self._inflight:     # ended: its blocks are free now
                self._unhold(h)
        if h.error is not None:
            return
        with self.flags.stream():     # the layer's flag (remote_transfer_arrived) after it
            if r.into is not None:
                r.into.copy_(r.buf)
            h.remote_transfer_arrived(r.j, r.layer)

    def send_control(self, dst: int, m: Message) -> None:
        """Send a control message; never blocks. Inside a host a full ring (the peer has not
        read for a while) queues the message here, in order, until a later call finds room."""
        if dst in self._remote:
            # a peer that closed reads no more: a send to it would never complete
            if dst not in self._dead and dst not in self._closed_by:
                self._gloo.send(dst, m)
            return
        box = self._outbox.setdefault(dst, [])
        box.append(m)
        self._flush_outbox()

    def _flush_outbox(self) -> None:
        for dst, box in self._outbox.items():
            while box and self._shm.room(dst):
                self._shm.send(dst, box.pop(0))

    def check_device(self) -> None:
        """Raise :class:`~tilecomm.device.errors.DeviceTimeout` if a device wait for a layer
        (``ExpectHandle.wait_on_device``) gave up since the last check (synchronizes on
        CUDA)."""
        self._check_cache()
        self.heap.check("kv.wait_layer")

    # ---- teardown ---------------------------------------------------------------------------
    def close(self) -> None:
        """Wait for this rank's pushes to finish and end the engine (every rank calls it when
        ranks span hosts, each telling the others it sends no more, and with CUDA caches).
        CPU caches stay valid until the communicator closes; the engine drops its references
        to the cache and its board, so both return to the heap once the caller drops
        ``cache``. CUDA caches: close frees the cache's device heap once every rank of the
        host got here (stop using the cache first)."""
        if self._closed:
            return
        try:
            for h in list(self._handles.values()):       # its senders must stop writing
                h.cancel(f"rank {self.rank} closed its KVTransfer")
            for dst, rid in list(self._expects):       # requests it will never push
                ex = self._expects[(dst, rid)]
                self.send_control(dst, Message(NOTICE, rid, (FAILED, ex.gen), text=(
                    f"rank {self.rank} closed its KVTransfer before pushing request "
                    f"{rid!r} (layers {sorted(set(range(self.geometry.layers)) - ex.pushed)} "
                    f"were never sent)")))
                self._drop_expectation(dst, rid)
            for ph in self._pushes:
                if ph.error is not None:      # its caller heard; its data drains by itself
                    continue
                try:
                    ph.wait()
                except CommTimeout:
                    if ph.dst not in self._dead:        # a dead host's pushes are moot
                        raise
            # notices still queued for a local peer whose ring is full: give it a moment
            # (a peer that closed first never reads them, and nothing waits for them)
            end = time.monotonic() + min(1.0, self.timeout)
            wait = Backoff()
            while any(self._outbox.values()) and time.monotonic() < end:
                wait()
                self._flush_outbox()
            deadline = time.monotonic() + self.timeout
            if self._gloo is not None:
                live = [p for p in self._remote if p not in self._dead]
                for p in live:
                    self._gloo.send(p, Message(CLOSE, "close"))
                while {p for p in live if p not in self._dead} - self._closed_by or \
                        any(self._recvs.values()) or any(p.pending for p in self._pushes):
                    if time.monotonic() > deadline:
                        missing = tuple(sorted(set(live) - self._closed_by))
                        raise CommTimeout(f"kv close on rank {self.rank}: rank(s) "
                                          f"{list(missing)} did not close within "
                                          f"{self.timeout:g} s", collective="kv.close",
                                          missing=missing)
                    wait()
                    self.progress()
            if self.heap is not None and self.cache.is_cuda:
                self.heap.barrier()     # no peer copies into this cache any more
                self._gloo_stop()
                self.cache = self._raw = None
                self.flags = self._scratch = None
                self._peer_caches.clear()
                self.heap.close()
        finally:
            self._closed = True
            # drop the symmetric tensors now (handles refer back to this object, so the
            # cycle collector would free them later, at a different moment on each rank, and
            # the next comm.alloc would find the heaps diverged)
            self._handles.clear()
            self._by_slot.clear()
            self._gloo_stop()
            self.cache = self._raw = self._board = self._board_np = self.board = None
            self.flags = self._scratch = None
            self._peer_caches.clear()
            self._peer_boards = {}
            self._shm = None
            if self.interpreted_launches:
                # the Triton interpreter keeps a launch's arguments (views of the cache and
                # the board) in a reference cycle: collect it now, or the heap blocks would
                # come back at a different moment on each rank
                gc.collect()

    def _gloo_stop(self) -> None:
        if self._gloo is not None:
            self._gloo.stop()            # its threads drop their views of the cache
            self._gloo = None

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


def _round_up(n: int, to: int) -> int:
    return -(-n // to) * to


def _rank(r) -> int | None:
    """``r`` as a rank number (ints, numpy and torch integers), or None."""
    if isinstance(r, bool):
        return None
    try:
        return operator.index(r)
    except TypeError:
        return None


def _ranks(src) -> list:
    """One rank or a list of them; what is not a rank stays as given, for the message."""
    one = _rank(src)
    if one is not None:
        return [one]
    try:
        return [_rank(s) if _rank(s) is not None else s for s in src]
    except TypeError:
        return [src]


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

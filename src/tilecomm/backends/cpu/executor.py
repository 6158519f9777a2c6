"""Runs a registered schedule over the shared-memory heap (one rank's side).

For one collective call::

    post descriptor, stage inputs of piece 0, run leading local phases   -> step "ready"
    handshake: wait for every rank's "ready", compare descriptors        (mismatch: all raise)
    for each piece k:
        (k > 0) stage inputs of piece k, leading local phases             -> step "ready"
        for each phase p with remote reads:
            wait for schedule.waits_before(rank, p); do my moves          -> step "phase p done"
        copy staged outputs back; wait for schedule.waits_at_end(rank)

Buffers peers read must be in symmetric memory: a user tensor from ``comm.alloc`` is read where
it is (zero copy); any other tensor is staged through this rank's scratch. Each rank announces
where its buffers are in its descriptor, so peers may stage differently. Messages larger than
the scratch area run in pieces; every chunk contributes its ``k``-th slice of ``piece_elems``
elements to piece ``k`` (scratch keeps one slot of ``piece_elems`` per chunk).

NOTE [skipping the final wait]
    Scratch alternates halves by sequence parity. If peers read only this rank's scratch in the
    last phase, the rank may return without waiting for them: the next collective writes the
    other half, and the one after that starts only after every peer has posted the next one's
    handshake, i.e. finished this one. One synchronization per one_shot all_reduce.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from ...algorithms.collectives import COLLECTIVES, chunk_lengths
from ...algorithms.registry import get_schedule
from ...algorithms.schedule import Schedule
from ...errors import CommError, CommMismatch, CommTimeout
from ...types import OP_BY_ID, OP_ID, DType, ReduceOp, combine, scale_avg, typed_view
from ..base import CollectiveCall
from .channel import (COLL_IDS, COLL_NAMES, D_ALGO, D_COLL, D_COUNT, D_DTYPE, D_EXTRA, D_MSGLEN,
                      D_OP, D_PIECE, D_PLACE, D_ROOT, D_SEQ, ERROR_ID, NUM_PLACES,
                      PLACE_LOCAL, PLACE_SCRATCH, Channel, algo_id)

_USER_BUFFERS = ("buf", "in", "out")


@dataclass(frozen=True)
class _Program:
    """One rank's moves, grouped per phase into fused operations (built once per schedule)."""

    sched: Schedule
    ops: tuple[tuple[tuple, ...], ...]      # per phase: (dst_loc, ((src_rank, src_loc, reduce), ...))
    waits: tuple[tuple[int, ...], ...]      # per phase: ranks to wait for before it
    end_waits: tuple[int, ...]              # ranks to wait for before returning
    scratch_bufs: tuple[str, ...]           # buffers that may live in scratch, in slot order
    slot_base: dict                         # buffer -> first scratch slot
    last_read_bufs: frozenset[str]          # my buffers peers read in the last phase


@lru_cache(maxsize=512)
def _program(collective: str, algo: str, world_size: int, root: int, rank: int) -> _Program:
    sched = get_schedule(collective, algo, world_size, root)
    ops = []
    for p in range(len(sched.phases)):
        grouped: list[tuple] = []
        for m in sched.moves_of(rank, p):
            if grouped and grouped[-1][0] == m.dst and m.reduce:
                grouped[-1] = (m.dst, grouped[-1][1] + ((m.src_rank, m.src, True),))
            else:
                grouped.append((m.dst, ((m.src_rank, m.src, m.reduce),)))
        ops.append(tuple(grouped))
    remote = sched.remote_read_buffers()
    scratch = tuple(b.name for b in sched.buffers if b.like is not None or b.name in remote)
    last = frozenset(m.src.buf for m in (sched.phases[-1] if sched.phases else ())
                     if m.src_rank == rank and m.rank != rank)
    waits = tuple(tuple(sorted(sched.waits_before(rank, p))) for p in range(len(sched.phases)))
    base, slot = {}, 0
    for b in scratch:
        base[b] = slot
        slot += sched.buffer(b).nchunks
    return _Program(sched, tuple(ops), waits, tuple(sorted(sched.waits_at_end(rank))), scratch,
                    base, last)


class Executor:
    """Executes collective schedules for one rank of a shared-memory communicator."""

    def __init__(self, channel: Channel, heap, scratch_bytes: int):
        self.ch = channel
        self.heap = heap
        self.rank, self.world_size = channel.rank, channel.world_size
        self.layout = heap.layout
        self.half_bytes = scratch_bytes // 2
        self.segs = [heap.segment(r) for r in range(self.world_size)]
        self.seq = 0
        self.broken: str | None = None

    # ---- entry points ---------------------------------------------------------------------
    def run(self, call: CollectiveCall) -> None:
        self._check_usable()
        prog = _program(call.collective, call.algo, self.world_size, call.root, self.rank)
        seq = self.seq
        self.seq += 1
        try:
            self._run(call, prog, seq)
        except CommTimeout as e:
            self.broken = f"{call.collective} #{seq} failed: {e}"
            raise
        except CommError:
            raise   # every rank raised at the same step: the communicator stays consistent
        except BaseException:
            self.broken = f"{call.collective} #{seq} was interrupted on rank {self.rank}"
            raise

    def reject(self, collective: str, message: str) -> None:
        """Post an error descriptor for the next sequence number so peers raise, not hang."""
        self._check_usable()
        seq = self.seq
        self.seq += 1
        n = self.ch.post_message(seq, f"{collective}: {message}")
        fields = [0] * (D_MSGLEN + 1)
        fields[D_SEQ], fields[D_COLL], fields[D_MSGLEN] = seq, ERROR_ID, n
        self.ch.post_desc(seq, fields)
        # Wait for everyone to arrive, like any collective: a rank that returned early could
        # start the next collective while a peer still reads its scratch from the last one.
        step = self.ch.advance()
        self.ch.wait_progress(range(self.world_size), step, (collective, seq, "every rank to arrive"))

    def rendezvous(self, name: str, count: int, extra: int) -> list[int]:
        """A handshake with no data (barrier, alloc); returns every rank's ``extra``."""
        self._check_usable()
        seq = self.seq
        self.seq += 1
        fields = self._fields(seq, name, "direct", 0, count, None, 0, extra, 0, ())
        self.ch.post_desc(seq, fields)
        descs = self._handshake(seq, name, fields)
        return [d[D_EXTRA] for d in descs]

    def _check_usable(self) -> None:
        if self.broken:
            raise CommError(f"communicator unusable: {self.broken}; create a new one")

    # ---- descriptor handshake -------------------------------------------------------------
    def _fields(self, seq, coll, algo, dtype_id, count, op, root, extra, piece, places):
        f = [0] * (D_PLACE + NUM_PLACES)
        f[D_SEQ], f[D_COLL], f[D_ALGO], f[D_DTYPE] = seq, COLL_IDS[coll], algo_id(algo), dtype_id
        f[D_COUNT], f[D_OP], f[D_ROOT], f[D_EXTRA] = count, OP_ID[op] if op else 0, root, extra
        f[D_PIECE] = piece
        for i, p in enumerate(places):
            f[D_PLACE + i] = p
        return f

    def _handshake(self, seq: int, coll: str, mine: list[int]) -> list[list[int]]:
        """Publish 'ready', wait for every rank's, and check all ranks called the same thing."""
        ch = self.ch
        step = ch.advance()
        ch.wait_progress(range(self.world_size), step, (coll, seq, "every rank to arrive"))
        descs = [mine if r == self.rank else ch.read_desc(r, seq) for r in range(self.world_size)]
        for r, d in enumerate(descs):
            if d[D_COLL] == ERROR_ID:
                text = ch.read_message(r, seq, d[D_MSGLEN])
                raise CommError(f"{coll} #{seq}: rank {r} rejected its call: {text}")
        for idx, label in ((D_COLL, "collective"), (D_DTYPE, "dtype"), (D_COUNT, "count"),
                           (D_OP, "op"), (D_ROOT, "root"), (D_ALGO, "algorithm"),
                           (D_EXTRA, "split sizes" if coll == "all_to_all_v" else "extra"),
                           (D_PIECE, "piece size (TILECOMM_SCRATCH_BYTES)")):
            if coll == "alloc" and idx == D_EXTRA:
                continue
            vals = [d[idx] for d in descs]
            if len(set(vals)) > 1:
                shown = ", ".join(f"rank {r}: {_show(idx, v)}" for r, v in enumerate(vals))
                raise CommMismatch(f"{coll} #{seq}: ranks disagree on {label}: {shown}")
        return descs

    # ---- one collective -------------------------------------------------------------------
    def _run(self, call: CollectiveCall, prog: _Program, seq: int) -> None:
        ch, me, w = self.ch, self.rank, self.world_size
        sched = prog.sched
        d = call.dtype
        isz = d.itemsize
        names = [b.name for b in sched.buffers]
        places = [self._place(b, call, prog) for b in names]
        nslots = sum(sched.buffer(b).nchunks for b in prog.scratch_bufs)
        piece = (self.half_bytes // isz) // nslots if nslots else 0
        if nslots and piece < 1:
            raise ValueError("TILECOMM_SCRATCH_BYTES is too small for this world size")
        variable = call.collective == "all_to_all_v"
        extra = 0
        if variable:
            extra = self._post_rows(seq, call)
        fields = self._fields(seq, call.collective, call.algo, d.id, call.count, call.op,
                              call.root, extra, piece, places)
        ch.post_desc(seq, fields)

        counts = None
        if not variable:
            lens = {b: chunk_lengths(sched, me, b, call.count) for b in names}
            peer_lens = None
            pieces = self._num_pieces(lens, piece)
            self._stage_and_local(call, sched, prog, 0, piece, lens, places, seq)
            descs = self._handshake(seq, call.collective, fields)
        else:
            descs = self._handshake(seq, call.collective, fields)
            rows = self._read_matrix(seq)
            if call.buffers.get("out") is None:
                call.buffers["out"] = call.make_out(sum(rows[j][me] for j in range(w)))
            counts = [[x * call.count for x in row] for row in rows]
            lens = {b: chunk_lengths(sched, me, b, call.count, counts) for b in names}
            peer_lens = [{b: chunk_lengths(sched, r, b, call.count, counts) for b in names}
                         for r in range(w)]
            pieces = max(self._num_pieces(pl, piece) for pl in peer_lens)
        peer_places = [[desc[D_PLACE + i] for i in range(len(names))] for desc in descs]
        ctx = _Ctx(self, call, sched, prog, seq, piece, names, peer_places, lens, peer_lens)

        nphases = len(sched.phases)
        lead = sched.leading_local_phases
        for k in range(pieces):
            if k > 0 or variable:
                self._stage_and_local(call, sched, prog, k, piece, lens, places, seq)
                ch.advance()
            ready = ch.step
            for p in range(lead, nphases):
                waits = prog.waits[p]
                if waits:
                    ch.wait_progress(waits, ready + (p - lead),
                                     (call.collective, seq, f"phase {p} of piece {k}"))
                ctx.do_phase(p, k)
                ch.advance()
            self._copy_out(call, prog, seq, k, piece, lens, places)
            last = k == pieces - 1
            skip = last and all(places[names.index(b)] == PLACE_SCRATCH
                                for b in prog.last_read_bufs)
            ends = prog.end_waits
            if ends and not skip:
                ch.wait_progress(ends, ch.step, (call.collective, seq, f"readers of piece {k}"))
        if call.op is ReduceOp.AVG:
            self._scale_avg(call)

    def _place(self, buf: str, call: CollectiveCall, prog: _Program) -> int:
        if buf not in _USER_BUFFERS:
            return PLACE_SCRATCH
        if buf not in prog.scratch_bufs:
            return PLACE_LOCAL
        arr = call.buffers.get(buf)
        if arr is None:     # all_to_all_v output not allocated yet (never read remotely)
            return PLACE_SCRATCH
        off = self.heap.offset_of(arr)
        if off is not None and off >= self.layout.heap_offset:
            return off
        return PLACE_SCRATCH

    @staticmethod
    def _num_pieces(lens: dict[str, list[int]], piece: int) -> int:
        longest = max((x for v in lens.values() for x in v), default=0)
        if not piece or longest == 0:
            return 1
        return max(1, -(-longest // piece))

    # ---- staging --------------------------------------------------------------------------
    def _stage_and_local(self, call, sched, prog, k, piece, lens, places, seq) -> None:
        """Copy this piece of staged inputs into scratch and run the leading local phases."""
        spec = COLLECTIVES[call.collective]
        names = [b.name for b in sched.buffers]
        for i, b in enumerate(names):
            if places[i] != PLACE_SCRATCH or b not in _USER_BUFFERS or b not in spec.inputs:
                continue
            user = call.buffers[b]
            for c, (start, n) in enumerate(_slices(lens[b], k, piece)):
                if n:
                    dst = self._scratch(self.rank, seq, prog, b, c, piece, n, call.dtype)
                    np.copyto(dst, user[start * call.dtype.itemsize:(start + n) * call.dtype.itemsize])
        if sched.leading_local_phases:
            ctx = _Ctx(self, call, sched, prog, seq, piece, names,
                       [places] * self.world_size, lens, None)
            for p in range(sched.leading_local_phases):
                ctx.do_phase(p, k)

    def _copy_out(self, call, prog, seq, k, piece, lens, places) -> None:
        sched = prog.sched
        names = [b.name for b in sched.buffers]
        isz = call.dtype.itemsize
        for i, b in enumerate(names):
            if places[i] != PLACE_SCRATCH or b not in ("buf", "out"):
                continue
            if b == "buf" and call.collective == "reduce" and self.rank != call.root:
                continue
            user = call.buffers[b]
            for c, (start, n) in enumerate(_slices(lens[b], k, piece)):
                if n:
                    src = self._scratch(self.rank, seq, prog, b, c, piece, n, call.dtype)
                    np.copyto(user[start * isz:(start + n) * isz], src)

    def _scratch(self, rank, seq, prog, buf, chunk, piece, n, d: DType) -> np.ndarray:
        """Raw bytes of ``rank``'s scratch slot for ``buf[chunk]`` (first ``n`` elements)."""
        slot = prog.slot_base[buf] + chunk
        off = self.layout.scratch_half(seq & 1) + slot * piece * d.itemsize
        return self.segs[rank][off:off + n * d.itemsize]

    def _scale_avg(self, call: CollectiveCall) -> None:
        if call.collective == "reduce" and self.rank != call.root:
            return
        out = call.buffers["out" if "out" in call.buffers else "buf"]
        scale_avg(typed_view(out, call.dtype), self.world_size)

    # ---- all_to_all_v rows ----------------------------------------------------------------
    def _post_rows(self, seq: int, call: CollectiveCall) -> int:
        lay, me = self.layout, self.ch.me
        s0, r0 = lay.row_slot(seq & 1, 0), lay.row_slot(seq & 1, 1)
        for j in range(self.world_size):
            me[s0 + j] = int(call.send_rows[j])
            me[r0 + j] = -1 if call.recv_rows is None else int(call.recv_rows[j])
        return 0

    def _read_matrix(self, seq: int) -> list[list[int]]:
        """The exchanged send matrix (rows), after checking every rank's recv rows."""
        lay, w = self.layout, self.world_size
        send = [list(self.ch.slots[r][lay.row_slot(seq & 1, 0):lay.row_slot(seq & 1, 0) + w])
                for r in range(w)]
        recv = [list(self.ch.slots[r][lay.row_slot(seq & 1, 1):lay.row_slot(seq & 1, 1) + w])
                for r in range(w)]
        for r in range(w):
            for j in range(w):
                if recv[r][j] >= 0 and recv[r][j] != send[j][r]:
                    raise CommMismatch(
                        f"all_to_all_v #{seq}: ranks disagree on split sizes: rank {r} expects "
                        f"{recv[r][j]} rows from rank {j}, which sends it {send[j][r]}")
        return send


def _slices(lens: list[int], k: int, piece: int):
    """``(element start, length)`` of piece ``k`` of every chunk of a buffer."""
    out, start = [], 0
    for n in lens:
        if piece:
            lo = min(n, k * piece)
            out.append((start + lo, min(n, lo + piece) - lo))
        else:
            out.append((start, n))
        start += n
    return out


class _Ctx:
    """Address resolution for the moves of one collective on this rank."""

    def __init__(self, ex: Executor, call, sched, prog, seq, piece, names, peer_places, lens,
                 peer_lens):
        self.ex, self.call, self.sched, self.prog = ex, call, sched, prog
        self.seq, self.piece, self.names = seq, piece, names
        self.peer_places, self.lens, self.peer_lens = peer_places, lens, peer_lens
        self.d = call.dtype
        self.op = call.op

    def raw(self, rank: int, buf: str, chunk: int, k: int) -> np.ndarray:
        ex, isz = self.ex, self.d.itemsize
        lens = self.lens if self.peer_lens is None else self.peer_lens[rank]
        start, n = _slices(lens[buf], k, self.piece)[chunk]
        place = self.peer_places[rank][self.names.index(buf)]
        if place == PLACE_SCRATCH:
            return ex._scratch(rank, self.seq, self.prog, buf, chunk, self.piece, n, self.d)
        if place == PLACE_LOCAL or place is None:
            assert rank == ex.rank, "peer read of a buffer that is not in symmetric memory"
            return self.call.buffers[buf][start * isz:(start + n) * isz]
        off = place + start * isz
        return ex.segs[rank][off:off + n * isz]

    def do_phase(self, p: int, k: int) -> None:
        me = self.ex.rank
        for dst_loc, srcs in self.prog.ops[p]:
            dst = self.raw(me, dst_loc.buf, dst_loc.chunk, k)
            if not dst.size:
                continue
            first_rank, first_loc, first_reduce = srcs[0]
            a = self.raw(first_rank, first_loc.buf, first_loc.chunk, k)
            if len(srcs) == 1 and not first_reduce:
                np.copyto(dst, a)
                continue
            tdst = typed_view(dst, self.d)
            if first_reduce:
                combine(tdst, tdst, typed_view(a, self.d), self.op)
                rest = srcs[1:]
            else:
                r1, l1, _ = srcs[1]
                b = self.raw(r1, l1.buf, l1.chunk, k)
                combine(tdst, typed_view(a, self.d), typed_view(b, self.d), self.op)
                rest = srcs[2:]
            for r, loc, _ in rest:
                combine(tdst, tdst, typed_view(self.raw(r, loc.buf, loc.chunk, k), self.d),
                        self.op)


def _show(idx: int, v: int) -> str:
    if idx == D_COLL:
        return COLL_NAMES.get(v, "error" if v == ERROR_ID else str(v))
    if idx == D_OP:
        return OP_BY_ID[v].value if v in OP_BY_ID else "none"
    if idx == D_DTYPE:
        from ...types import DTYPE_BY_ID
        return DTYPE_BY_ID[v].name if v in DTYPE_BY_ID else str(v)
    if idx == D_ALGO:
        from ...algorithms.registry import all_algorithms
        names = {algo_id(a): a for _, a in all_algorithms()}
        return names.get(v, str(v))
    return str(v)

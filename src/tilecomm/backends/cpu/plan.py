"""Turns one rank's share of a schedule into ready-to-call operations on concrete memory.

A :class:`Program` is the rank's moves grouped per phase (built once per schedule). A
:class:`Layout` fixes the element ranges of every chunk of every buffer for one call. From both,
``pre_ops`` (staging copies and leading local phases: nothing that reads a peer), ``phase_ops``
(one list per remaining phase) and ``post_ops`` (copies back from scratch) produce lists of
zero-argument callables over numpy/torch views, so running a cached plan costs one Python call
per fused move.

Where a buffer lives is its *place*: a byte offset in the owner's segment (symmetric tensor,
read in place), ``PLACE_SCRATCH`` (staged in, or scratch by nature), or ``PLACE_LOCAL`` (caller's
memory, never read by peers).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache, partial

import numpy as np

from ...algorithms.collectives import COLLECTIVES, chunk_lengths
from ...algorithms.registry import get_schedule
from ...algorithms.schedule import Schedule
from ...types import _NP_UFUNC, _TORCH_FN, DType, ReduceOp, typed_view

PLACE_SCRATCH = -1   # staged in (or lives in) the scratch area
PLACE_LOCAL = -2     # no peer reads it: it stays in the caller's memory
USER_BUFFERS = ("buf", "in", "out")


@dataclass(frozen=True)
class Program:
    """One rank's moves, grouped per phase into fused operations (built once per schedule)."""

    sched: Schedule
    names: tuple[str, ...]                  # buffer names in descriptor order
    ops: tuple[tuple[tuple, ...], ...]      # per phase: (dst_loc, ((src_rank, src_loc, reduce),...))
    waits: tuple[tuple[int, ...], ...]      # per phase: ranks to wait for before it
    end_waits: tuple[int, ...]              # ranks to wait for before returning
    scratch_bufs: tuple[str, ...]           # buffers that may live in scratch, in slot order
    slot_base: dict                         # buffer -> first scratch slot
    nslots: int
    last_read_bufs: tuple[int, ...]         # indices of my buffers peers read in the last phase
    lead: int                               # leading phases without remote reads


@lru_cache(maxsize=512)
def program(collective: str, algo: str, world_size: int, root: int, rank: int) -> Program:
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
    names = tuple(b.name for b in sched.buffers)
    scratch = tuple(b for b in names if sched.buffer(b).like is not None or b in remote)
    base, slot = {}, 0
    for b in scratch:
        base[b] = slot
        slot += sched.buffer(b).nchunks
    last = {m.src.buf for m in (sched.phases[-1] if sched.phases else ())
            if m.src_rank == rank and m.rank != rank}
    return Program(sched, names, tuple(ops),
                   tuple(tuple(sorted(sched.waits_before(rank, p)))
                         for p in range(len(sched.phases))),
                   tuple(sorted(sched.waits_at_end(rank))), scratch, base, slot,
                   tuple(names.index(b) for b in sorted(last)), sched.leading_local_phases)


@dataclass
class Layout:
    """Element ranges of one call: ``lens[rank][buf]`` chunk lengths, ``piece`` elements per
    chunk per piece (0: one piece), and the byte geometry of the scratch halves."""

    lens: list[dict[str, list[int]]]
    piece: int
    pieces: int
    d: DType


def make_layout(prog: Program, world_size: int, count: int, d: DType, half_bytes: int | None,
                counts=None) -> Layout:
    """``half_bytes``: bytes of one scratch half (None: no limit, one piece)."""
    sched = prog.sched
    piece = (half_bytes // d.itemsize) // prog.nslots if prog.nslots and half_bytes else 0
    if prog.nslots and half_bytes and piece < 1:
        raise ValueError("TILECOMM_SCRATCH_BYTES is too small for this world size")
    if counts is None:
        mine = {b: chunk_lengths(sched, 0, b, count) for b in prog.names}
        lens = [mine] * world_size
    else:
        lens = [{b: chunk_lengths(sched, r, b, count, counts) for b in prog.names}
                for r in range(world_size)]
    longest = max((x for per in lens for v in per.values() for x in v), default=0)
    pieces = 1 if not piece or not longest else max(1, -(-longest // piece))
    return Layout(lens, piece, pieces, d)


def slices(lens: list[int], k: int, piece: int) -> list[tuple[int, int]]:
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


class Addresser:
    """Raw byte views of ``(rank, buffer, chunk)`` for piece ``k`` of one call."""

    def __init__(self, prog: Program, layout: Layout, segs, user: dict, places, scratch_off):
        self.prog, self.layout, self.segs, self.user = prog, layout, segs, user
        self.places, self.scratch_off = places, scratch_off   # places[rank][buffer index]

    def raw(self, rank: int, buf: str, chunk: int, k: int) -> np.ndarray:
        lay = self.layout
        isz = lay.d.itemsize
        start, n = slices(lay.lens[rank][buf], k, lay.piece)[chunk]
        place = self.places[rank][self.prog.names.index(buf)]
        if place == PLACE_SCRATCH:
            off = self.scratch_off + (self.prog.slot_base[buf] + chunk) * lay.piece * isz
            return self.segs[rank][off:off + n * isz]
        if place == PLACE_LOCAL:
            return self.user[buf][start * isz:(start + n) * isz]
        off = place + start * isz
        return self.segs[rank][off:off + n * isz]


def _fused(d: DType, op: ReduceOp, dst: np.ndarray, srcs: list[np.ndarray], first_reduce: bool):
    """Callables computing ``dst = srcs[0] (op) srcs[1] ...`` (or ``dst (op)= ...``)."""
    if not first_reduce and len(srcs) == 1:
        if _addr(dst) == _addr(srcs[0]):
            return []   # an aliased buffer copied onto itself
        return [partial(np.copyto, dst, srcs[0])]
    fn = _NP_UFUNC[op] if d.numpy is not None else _TORCH_FN[op]
    t = typed_view(dst, d)
    views = [typed_view(s, d) for s in srcs]
    calls = []
    if first_reduce:
        acc = [t] + views
    else:
        acc = views
    calls.append(partial(fn, acc[0], acc[1], out=t))
    for v in acc[2:]:
        calls.append(partial(fn, t, v, out=t))
    return calls


def _addr(a: np.ndarray) -> int:
    return a.__array_interface__["data"][0]


def phase_ops(addr: Addresser, p: int, k: int, me: int, op: ReduceOp | None) -> list:
    """Callables doing this rank's moves of phase ``p``, piece ``k``."""
    calls = []
    d = addr.layout.d
    for dst_loc, srcs in addr.prog.ops[p]:
        dst = addr.raw(me, dst_loc.buf, dst_loc.chunk, k)
        if not dst.size:
            continue
        views = [addr.raw(r, loc.buf, loc.chunk, k) for r, loc, _ in srcs]
        calls += _fused(d, op or ReduceOp.SUM, dst, views, srcs[0][2])
    return calls


def stage_ops(addr: Addresser, collective: str, k: int, me: int, inbound: bool) -> list:
    """Copies between the caller's buffers and their scratch slots (in before, out after)."""
    spec = COLLECTIVES[collective]
    lay = addr.layout
    isz = lay.d.itemsize
    calls = []
    for i, b in enumerate(addr.prog.names):
        if addr.places[me][i] != PLACE_SCRATCH or b not in USER_BUFFERS:
            continue
        if inbound and b not in spec.inputs:
            continue
        if not inbound and b not in ("buf", "out"):
            continue
        user = addr.user[b]
        for c, (start, n) in enumerate(slices(lay.lens[me][b], k, lay.piece)):
            if n:
                slot = addr.raw(me, b, c, k)
                mem = user[start * isz:(start + n) * isz]
                calls.append(partial(np.copyto, slot, mem) if inbound
                             else partial(np.copyto, mem, slot))
    return calls

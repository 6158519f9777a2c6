"""Turns one rank's share of a schedule into ready-to-call operations on concrete memory.

A :class:`Program` is the rank's moves grouped per phase (built once per schedule). A
:class:`Layout` fixes the element ranges of every chunk of every buffer for one call. From both
and the places every rank announced, ``phase_template`` and ``stage_template`` give
:class:`Op` lists whose operands are (segment or caller buffer, offset of piece 0, step per
piece): one template serves every piece and holds no reference to the caller's memory, so it
can be cached for calls of any size. A :class:`Runner` turns a template into numpy/torch calls
for one piece; small calls also cache those callables.

Where a buffer lives is its *place*: a byte offset in the owner's segment (symmetric tensor,
read in place), ``PLACE_SCRATCH`` (staged in, or scratch by nature), or ``PLACE_LOCAL`` (caller's
memory, never read by peers).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache, partial
from itertools import accumulate
from typing import NamedTuple

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


def piece_elems(prog: Program, itemsize: int, half_bytes: int | None) -> int:
    """Elements each chunk contributes to one piece when a piece may use ``half_bytes`` of
    scratch (0: no limit, one piece). Depends only on the schedule and the settings, so every
    rank computes the same value (it is also announced in the descriptor)."""
    if not prog.nslots or not half_bytes:
        return 0
    piece = (half_bytes // itemsize) // prog.nslots
    if piece < 1:
        raise ValueError("TILECOMM_SCRATCH_BYTES is too small for this world size")
    return piece


def piece_len(chunk: int, k: int, piece: int) -> int:
    """Elements of a ``chunk``-element chunk that fall in piece ``k`` (``piece`` 0: one piece)."""
    if not piece:
        return chunk if k == 0 else 0
    return max(0, min(piece, chunk - k * piece))


def make_layout(prog: Program, world_size: int, count: int, d: DType, half_bytes: int | None,
                counts=None) -> Layout:
    """``half_bytes``: bytes of one scratch half (None: no limit, one piece)."""
    sched = prog.sched
    piece = piece_elems(prog, d.itemsize, half_bytes)
    if counts is None:
        mine = {b: chunk_lengths(sched, 0, b, count) for b in prog.names}
        lens = [mine] * world_size
    else:
        lens = [{b: chunk_lengths(sched, r, b, count, counts) for b in prog.names}
                for r in range(world_size)]
    longest = max((x for per in lens for v in per.values() for x in v), default=0)
    pieces = 1 if not piece or not longest else max(1, -(-longest // piece))
    return Layout(lens, piece, pieces, d)


class Operand(NamedTuple):
    """Where one chunk of one buffer lives, for any piece: bytes ``[off0 + k * step, ...)`` of
    rank ``rank``'s segment, or of the caller's buffer ``buf`` when ``rank`` is None. Scratch
    slots have ``step == 0`` (every piece reuses the slot)."""

    rank: int | None
    buf: str
    off0: int
    step: int


class Op(NamedTuple):
    """``dst = srcs[0] (op) srcs[1] ...`` (``dst (op)= ...`` if ``first_reduce``; a copy when
    there is one source and no reduction) over a chunk of ``chunk`` elements."""

    dst: Operand
    srcs: tuple[Operand, ...]
    first_reduce: bool
    chunk: int


class Addresser:
    """Operands of ``(rank, buffer, chunk)`` for one call, from every rank's places."""

    def __init__(self, prog: Program, layout: Layout, places, scratch_off: int):
        self.prog, self.layout = prog, layout
        self.places, self.scratch_off = places, scratch_off   # places[rank][buffer index]
        self._starts: dict = {}

    def chunk_len(self, rank: int, buf: str, chunk: int) -> int:
        return self.layout.lens[rank][buf][chunk]

    def operand(self, rank: int, buf: str, chunk: int, me: int) -> Operand:
        lay, prog = self.layout, self.prog
        isz, piece = lay.d.itemsize, lay.piece
        starts = self._starts.get((rank, buf))
        if starts is None:
            starts = self._starts[(rank, buf)] = list(accumulate(lay.lens[rank][buf], initial=0))
        place = self.places[rank][prog.names.index(buf)]
        if place == PLACE_SCRATCH:
            return Operand(rank, buf, self.scratch_off + (prog.slot_base[buf] + chunk) * piece * isz,
                           0)
        if place == PLACE_LOCAL:
            assert rank == me, "a peer's buffer that is not in symmetric memory"
            return Operand(None, buf, starts[chunk] * isz, piece * isz)
        return Operand(rank, buf, place + starts[chunk] * isz, piece * isz)

    def aliased(self, a: str, b: str, rank: int) -> bool:
        """Whether buffers ``a`` and ``b`` of ``rank`` share storage (an active alias)."""
        sched = self.prog.sched
        for x, y in ((a, b), (b, a)):
            spec = sched.buffer(x)
            if spec.alias and spec.like == y and \
                    self.places[rank][self.prog.names.index(x)] >= 0:
                return True
        return False


def phase_template(addr: Addresser, p: int, me: int) -> list[Op]:
    """This rank's moves of phase ``p`` as operations (aliased self-copies dropped)."""
    ops = []
    for dst_loc, srcs in addr.prog.ops[p]:
        if (len(srcs) == 1 and not srcs[0][2] and srcs[0][0] == me
                and srcs[0][1].chunk == dst_loc.chunk
                and addr.aliased(dst_loc.buf, srcs[0][1].buf, me)):
            continue
        ops.append(Op(addr.operand(me, dst_loc.buf, dst_loc.chunk, me),
                      tuple(addr.operand(r, loc.buf, loc.chunk, me) for r, loc, _ in srcs),
                      srcs[0][2], addr.chunk_len(me, dst_loc.buf, dst_loc.chunk)))
    return ops


def stage_template(addr: Addresser, collective: str, me: int, inbound: bool) -> list[Op]:
    """Copies between the caller's buffers and their scratch slots (in before, out after)."""
    spec = COLLECTIVES[collective]
    ops = []
    for i, b in enumerate(addr.prog.names):
        if addr.places[me][i] != PLACE_SCRATCH or b not in USER_BUFFERS:
            continue
        if (inbound and b not in spec.inputs) or (not inbound and b not in ("buf", "out")):
            continue
        for c, n in enumerate(addr.layout.lens[me][b]):
            if not n:
                continue
            slot = addr.operand(me, b, c, me)
            isz = addr.layout.d.itemsize
            start = sum(addr.layout.lens[me][b][:c])
            user = Operand(None, b, start * isz, addr.layout.piece * isz)
            ops.append(Op(slot, (user,), False, n) if inbound else Op(user, (slot,), False, n))
    return ops


class Runner:
    """Turns operations into work on concrete memory for piece ``k``."""

    def __init__(self, segs, user: dict, layout: Layout, op: ReduceOp | None):
        self.segs, self.user, self.layout = segs, user, layout
        self.d = layout.d
        self.fn = (_NP_UFUNC if self.d.numpy is not None else _TORCH_FN)[op or ReduceOp.SUM]

    def _view(self, o: Operand, k: int, nbytes: int) -> np.ndarray:
        base = self.segs[o.rank] if o.rank is not None else self.user[o.buf]
        s = o.off0 + k * o.step
        return base[s:s + nbytes]

    def calls(self, ops: list[Op], k: int) -> list:
        """Zero-argument callables doing ``ops`` for piece ``k`` (for cached plans)."""
        out = []
        isz, d, fn = self.d.itemsize, self.d, self.fn
        for op in ops:
            n = piece_len(op.chunk, k, self.layout.piece)
            if not n:
                continue
            dst = self._view(op.dst, k, n * isz)
            srcs = [self._view(s, k, n * isz) for s in op.srcs]
            if len(srcs) == 1 and not op.first_reduce:
                out.append(partial(np.copyto, dst, srcs[0]))
                continue
            t = typed_view(dst, d)
            acc = ([t] if op.first_reduce else []) + [typed_view(x, d) for x in srcs]
            out.append(partial(fn, acc[0], acc[1], out=t))
            out.extend(partial(fn, t, v, out=t) for v in acc[2:])
        return out

    def run(self, ops: list[Op], k: int) -> None:
        """Do ``ops`` for piece ``k`` now (no callables kept)."""
        for f in self.calls(ops, k):
            f()

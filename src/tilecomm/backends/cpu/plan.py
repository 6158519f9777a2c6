"""Turns one rank's lowered plan into ready-to-call operations on concrete memory.

The plan (:class:`~tilecomm.algorithms.lower.RankPlan`, shared with the GPU plan kernel and the
simulator) holds the rank's reductions per phase. A :class:`Layout` fixes the element ranges
of every chunk of every buffer for one call. From both and the places every rank announced,
``phase_template`` and ``stage_template`` give :class:`Op` lists whose operands are (segment or
caller buffer, offset of piece 0, step per piece): one template serves every piece and holds no
reference to the caller's memory, so it can be cached for calls of any size. A :class:`Runner`
turns a template into numpy/torch calls for one piece; small calls also cache those callables.

Where a buffer lives is its *place*: a byte offset in the owner's segment (symmetric tensor,
read in place), ``PLACE_SCRATCH`` (staged in, or scratch by nature), ``PLACE_LOCAL`` (caller's
memory, never read by peers), or ``PLACE_CMA`` (caller's memory that peers read in place with
``process_vm_readv``, ``cma.py``: like a symmetric tensor, without the staging copy).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial
from itertools import accumulate
from typing import TYPE_CHECKING, NamedTuple

import numpy as np
import torch

from ...algorithms.collectives import COLLECTIVES, chunk_lengths
from ...algorithms.lower import USER_BUFFERS, piece_elems, piece_len
from ...errors import CommError
from ...types import NP_UFUNC, TORCH_FN, DType, ReduceOp, typed_view
from . import cma

if TYPE_CHECKING:
    from ...algorithms.placement import CpuPlan

PLACE_SCRATCH = -1   # staged in (or lives in) the scratch area
PLACE_LOCAL = -2     # no peer reads it: it stays in the caller's memory
PLACE_CMA = -3       # caller's memory that peers read with process_vm_readv (its address
                     # travels in the descriptor, channel.D_ADDR)


def underlying(prog: CpuPlan, buf: str) -> str:
    """The caller's buffer that a PLACE_CMA buffer is: itself, or for scratch that aliases a
    caller's buffer, the one it is like."""
    return buf if buf in USER_BUFFERS else prog.sched.buffer(buf).like


class PeerReadError(CommError):
    """Reading a peer's buffer with process_vm_readv failed (the peer died, or its memory is
    no longer where it announced): the ranks are out of step, so the communicator breaks.
    ``where`` names the call ("all_reduce #12 on rank 0")."""

    def __init__(self, peer: int, detail: str, where: str = ""):
        super().__init__(f"{where + ': ' if where else ''}reading rank {peer}'s buffer with "
                         f"process_vm_readv failed: {detail} (TILECOMM_CMA=0 stages every "
                         f"buffer instead)")
        self.peer, self.detail = peer, detail


@dataclass
class Layout:
    """Element ranges of one call: ``lens[rank][buf]`` chunk lengths, ``piece`` elements per
    chunk per piece (0: one piece), and the byte geometry of the scratch halves."""

    lens: list[dict[str, list[int]]]
    piece: int
    pieces: int
    d: DType


def make_layout(prog: CpuPlan, world_size: int, count: int, d: DType, half_bytes: int | None,
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
    rank ``rank``'s segment, or of the caller's buffer ``buf`` when ``rank`` is None, or, when
    ``remote``, of peer ``rank``'s own buffer ``buf`` (PLACE_CMA: read with process_vm_readv,
    from the address the peer announced). Scratch slots have ``step == 0`` (every piece
    reuses the slot)."""

    rank: int | None
    buf: str
    off0: int
    step: int
    remote: bool = False


class Op(NamedTuple):
    """``dst = srcs[0] (op) srcs[1] ...`` (``dst (op)= ...`` if ``first_reduce``; a copy when
    there is one source and no reduction) over a chunk of ``chunk`` elements. ``completes``: the
    result holds every rank's contribution (``avg`` divides before the result is rounded)."""

    dst: Operand
    srcs: tuple[Operand, ...]
    first_reduce: bool
    chunk: int
    completes: bool = False


class Addresser:
    """Operands of ``(rank, buffer, chunk)`` for one call, from every rank's places."""

    def __init__(self, prog: CpuPlan, layout: Layout, places, scratch_off: int):
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
        if place == PLACE_SCRATCH and rank == me and not self.staged(buf, chunk):
            place = PLACE_LOCAL
        if place == PLACE_CMA:
            if rank != me:
                return Operand(rank, buf, starts[chunk] * isz, piece * isz, True)
            return Operand(None, underlying(prog, buf), starts[chunk] * isz, piece * isz)
        if place == PLACE_SCRATCH:
            return Operand(rank, buf, self.scratch_off + (prog.slot_base[buf] + chunk) * piece * isz,
                           0)
        if place == PLACE_LOCAL:
            assert rank == me, "a peer's buffer that is not in symmetric memory"
            return Operand(None, buf, starts[chunk] * isz, piece * isz)
        return Operand(rank, buf, place + starts[chunk] * isz, piece * isz)

    def staged(self, buf: str, chunk: int) -> bool:
        """Whether chunk ``chunk`` of this rank's buffer ``buf``, when the buffer is not in
        symmetric memory, goes through scratch: a caller's buffer only where some peer reads
        that chunk. A broadcast's non-root buffer, an all_to_all's own block, a
        reduce_scatter's own chunk are used where they are: copying them in (and back out)
        would be passes over memory for nothing."""
        return buf not in USER_BUFFERS or chunk in self.prog.peer_read.get(buf, ())

    def aliased(self, a: str, b: str, rank: int) -> bool:
        """Whether buffers ``a`` and ``b`` of ``rank`` share storage (an active alias)."""
        sched = self.prog.sched
        for x, y in ((a, b), (b, a)):
            spec = sched.buffer(x)
            if spec.alias and spec.like == y:
                place = self.places[rank][self.prog.names.index(x)]
                if place >= 0 or place == PLACE_CMA:
                    return True
        return False


def phase_template(addr: Addresser, p: int, me: int) -> list[Op]:
    """This rank's reductions of phase ``p`` as operations (aliased self-copies dropped)."""
    ops = []
    for red in addr.prog.phases[p].ops:
        dst_loc, srcs = red.dst, red.srcs
        if (red.is_copy and srcs[0][0] == me and srcs[0][1].chunk == dst_loc.chunk
                and addr.aliased(dst_loc.buf, srcs[0][1].buf, me)):
            continue
        ops.append(Op(addr.operand(me, dst_loc.buf, dst_loc.chunk, me),
                      tuple(addr.operand(r, loc.buf, loc.chunk, me) for r, loc in srcs),
                      red.accumulate, addr.chunk_len(me, dst_loc.buf, dst_loc.chunk),
                      red.completes))
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
            if not n or not addr.staged(b, c):
                continue
            slot = addr.operand(me, b, c, me)
            isz = addr.layout.d.itemsize
            start = sum(addr.layout.lens[me][b][:c])
            user = Operand(None, b, start * isz, addr.layout.piece * isz)
            ops.append(Op(slot, (user,), False, n) if inbound else Op(user, (slot,), False, n))
    return ops


class Runner:
    """Turns operations into work on concrete memory for piece ``k``.

    NOTE [reduction order] (``algorithms/lower.py``): operands combine left to right; fp16 and
    bf16 accumulate in float32 and round once, when the destination is written; an op that
    ``completes`` a reduction applies ``avg``'s division before that rounding. This is what the
    GPU kernels compute, so both engines give the same bits.
    """

    def __init__(self, segs, user: dict, layout: Layout, op: ReduceOp | None,
                 world_size: int = 1):
        self.segs, self.user, self.layout = segs, user, layout
        self.d = layout.d
        self.op = op or ReduceOp.SUM
        self.world_size = world_size
        self.fn = (NP_UFUNC if self.d.numpy is not None else TORCH_FN)[self.op]
        #: (peer, buffer) -> (pid, address) of the peers' PLACE_CMA buffers, from their
        #: descriptors (set after the handshake, before any remote operand is used)
        self.remote: dict = {}

    def _fetch(self, o: Operand, k: int, into: np.ndarray) -> None:
        """Read a peer's PLACE_CMA operand for piece ``k`` into ``into`` (all its bytes)."""
        pid, base = self.remote[(o.rank, o.buf)]
        try:
            cma.read_into(pid, base + o.off0 + k * o.step, into.ctypes.data, into.nbytes)
        except OSError as e:
            raise PeerReadError(o.rank, str(e)) from None

    def _view(self, o: Operand, k: int, nbytes: int) -> np.ndarray:
        base = self.segs[o.rank] if o.rank is not None else self.user[o.buf]
        s = o.off0 + k * o.step
        return base[s:s + nbytes]

    def calls(self, ops: list[Op], k: int) -> list:
        """Zero-argument callables doing ``ops`` for piece ``k`` (for cached plans)."""
        out = []
        isz, d = self.d.itemsize, self.d
        avg = self.op is ReduceOp.AVG and self.world_size > 1
        for op in ops:
            n = piece_len(op.chunk, k, self.layout.piece)
            if not n:
                continue
            dst = self._view(op.dst, k, n * isz)
            if len(op.srcs) == 1 and not op.first_reduce:
                if op.srcs[0].remote:          # a peer's buffer: read straight into dst
                    out.append(partial(self._fetch, op.srcs[0], k, dst))
                else:
                    out.append(partial(np.copyto, dst, self._view(op.srcs[0], k, n * isz)))
                continue
            if any(s.remote for s in op.srcs):   # CpuPlan.peer_reduced stays staged
                raise RuntimeError("a peer's PLACE_CMA buffer read into a reduction")
            srcs = [self._view(s, k, n * isz) for s in op.srcs]
            t = typed_view(dst, d)
            acc = ([t] if op.first_reduce else []) + [typed_view(x, d) for x in srcs]
            scale = self.world_size if (avg and op.completes) else 0
            if d.numpy is None:
                if len(acc) == 2 and not scale:
                    # torch's fp16/bf16 CPU kernels widen both operands to float32, combine
                    # and round once: the same bits as the float32 accumulation, no temporary
                    out.append(partial(self.fn, acc[0], acc[1], out=t))
                else:
                    out.append(partial(_reduce_f32, t, acc, self.op, scale,
                                       torch.empty(n, dtype=torch.float32),
                                       torch.empty(n, dtype=torch.float32)))
                continue
            # Writing dst before its last read would corrupt a source that is dst itself (an
            # aliased buffer): accumulate elsewhere then. dst as the first or second operand
            # of the first step is safe (elementwise).
            if any(np.may_share_memory(dst, x) for x in
                   (([dst] if op.first_reduce else []) + srcs)[2:]):
                out.append(partial(_reduce_np, t, acc, self.fn, scale, np.empty_like(t)))
            else:
                out.append(partial(_reduce_np, t, acc, self.fn, scale, t))
        return out

    def run(self, ops: list[Op], k: int) -> None:
        """Do ``ops`` for piece ``k`` now (no callables kept)."""
        for f in self.calls(ops, k):
            f()


def _reduce_np(dst, operands, fn, scale: int, acc) -> None:
    """``dst = operands[0] fn operands[1] ...`` in numpy (``acc``: where to accumulate)."""
    fn(operands[0], operands[1], out=acc)
    for v in operands[2:]:
        fn(acc, v, out=acc)
    if scale:
        np.divide(acc, scale, out=acc, casting="unsafe")
    if acc is not dst:
        np.copyto(dst, acc)


_TORCH_INPLACE = {ReduceOp.SUM: torch.Tensor.add_, ReduceOp.AVG: torch.Tensor.add_,
                  ReduceOp.PROD: torch.Tensor.mul_}


def _reduce_f32(dst, operands, op: ReduceOp, scale: int, acc, wide) -> None:
    """16-bit floats: accumulate ``operands`` in float32 (``acc``), round once into ``dst``.
    Each operand is widened into ``wide`` first: a float32 op on a 16-bit operand takes
    torch's slower mixed-dtype path (1.5x for the whole reduction)."""
    acc.copy_(operands[0])
    f = _TORCH_INPLACE.get(op)
    for v in operands[1:]:
        wide.copy_(v)
        if f is not None:
            f(acc, wide)
        else:
            (torch.minimum if op is ReduceOp.MIN else torch.maximum)(acc, wide, out=acc)
    if scale:
        acc.div_(scale)
    dst.copy_(acc)

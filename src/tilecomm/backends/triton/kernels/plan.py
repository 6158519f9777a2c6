"""The plan kernel: one generic Triton kernel that executes any lowered schedule.

Every registered schedule (``tilecomm.algorithms``) lowers to one plan per rank
(``algorithms/lower.py``: phases of :class:`~tilecomm.algorithms.lower.PlanOp` with the ranks
to wait for and to tell). The CPU executor runs those plans; this kernel runs the same plans on
a GPU (and in the Triton interpreter), so every algorithm of every collective has a GPU path,
and the hand-fused kernels (``all_reduce.py``, ``gather_scatter.py``, ...) are fast paths that
must give its bits (``tests/kernels/test_conformance.py``). ``TILECOMM_GPU_FUSED=0`` runs every
call through this kernel (``registry.lookup``).

Host side (per call, :func:`launch_plan`)
-----------------------------------------
* Layout: every buffer of the schedule (``buf``/``in``/``out``/``tmp``) gets a region of one
  symmetric scratch half (``ctx.half("plan", ...)``, half ``epoch % 2``), at the same offset on
  every rank. A region is as long as the longest copy of that buffer on any rank (all_to_all_v:
  chunk lengths from the count matrix differ between ranks); rank ``r``'s chunk ``c`` starts at
  ``region + sum(r's chunks before c)``, which every rank computes from the matrix.
* Staging: the caller's inputs are copied into their regions (torch copies on the stream);
  after the kernel the outputs are copied out (``buf`` / ``out``; reduce: the root's only;
  broadcast: the non-roots').
* Tables (int64, on the device, cached per ``(collective, algo, world, root, rank, count,
  counts)``): ``phases[P + 1, 4]`` = (first op, end op, wait mask, notify mask) per phase, and
  a last row for the end (wait mask = ``end_waits``); ``ops[., 4]`` = (dst element offset,
  length, completes, first source, end source); ``srcs[., 2]`` = (rank, element offset) in
  combination order. An op that ``accumulate``\\ s lists its own destination as first source.
  Zero-length ops are dropped.

Kernel (:func:`plan_kernel`, grid ``G`` persistent programs)
------------------------------------------------------------
Program ``pid`` handles blocks ``pid, pid + G, ...`` *of each op's chunk*. Every move maps a
chunk to a chunk at the same relative offset, so element ``i`` of any chunk is only ever
touched by program ``(i // BLOCK) % G`` on every rank: programs depend only on the programs of
the same id on their peers (contract rule 4) and use their own slot groups. With ``S = P + 1``
steps (arrival, then one per phase), rank ``me``'s program ``pid`` announces step ``s`` by
setting slot ``((pid * S + s) * W + me)`` on a peer (``lang.signal_set``, release):

    arrival   signal step 0 to every peer (the inputs are staged)
    phase p   wait (acquire) own slots of step p from each rank of ``waits[p]``;
              do the ops; signal step p + 1 to each rank of ``notify[p]``
    end       wait step P from each rank of ``end_waits``, and step 0 (arrival) from every
              rank: a call completes only after every rank started it (contract rule 2)

Slot rule (rule 1): slot ``g * W + q`` is written by rank ``q`` only. Rule 3: everything peers
read is in the parity half of the ``plan`` scratch (never the caller's memory). Epoch =
``ctx.epoch``; the kernel launches even for empty calls (rule 2 then still holds).

Reduction (NOTE [reduction order] of ``lower.py``, exactly what ``backends/cpu/plan.py``'s
Runner computes): ``acc = src_0`` (widened to fp32 for fp16/bf16), ``acc = acc (op) src_k`` left
to right, ``avg`` divides by ``W`` only in ops that ``complete`` the reduction, one store (one
rounding). All sources of a block are loaded before its store, so a source may be the
destination. A single source without accumulation is a plain copy (bits untouched).
"""

from __future__ import annotations

from itertools import accumulate

import torch
import triton
import triton.language as tl

from tilecomm.device import lang

from ...base import CollectiveCall  # noqa: F401  (the launcher contract's type)
from ..registry import ALL_DTYPES, REDUCE_OPS, register_plan
from .common import OP_AVG, OP_SUM, acc_f32, combine, finish, load_acc, op_code

#: data-movement collectives also take the byte types
MOVE_DTYPES = ALL_DTYPES + (torch.uint8, torch.int8)

#: every buffer region starts at a multiple of this many elements (vector-friendly)
ALIGN = 64

#: columns of the tables
PH_COLS, OP_COLS, SRC_COLS = 4, 5, 2


@triton.jit(do_not_specialize=["nphases", "rank", "timeout_ns", "epoch"])
def plan_kernel(data, pad, phases, ops, srcs, nphases, bases, rank, err, timeout_ns, epoch,
                WORLD: tl.constexpr, BLOCK: tl.constexpr, OP: tl.constexpr,
                ACC_F32: tl.constexpr):
    """Run one rank's lowered plan (module docstring). ``data``: this rank's scratch half
    (symmetric; every element offset in the tables is relative to it). ``nphases``: ``P`` (the
    phase table has ``P + 1`` rows, the last one the end waits)."""
    pid = tl.program_id(0)
    G = tl.num_programs(0)
    step = G * BLOCK
    g0 = pid * (nphases + 1)
    ar = tl.arange(0, BLOCK)
    # arrival: the inputs are staged (stream order), tell every peer
    for q in tl.static_range(WORLD):
        if q != rank:
            lang.signal_set(pad, g0 * WORLD + rank, epoch, q, bases, rank)
    ok = tl.cast(1, tl.int1)
    for p in range(0, nphases + 1):
        row = phases + p * 4
        wmask = tl.load(row + 2)
        wslot = (g0 + p) * WORLD
        for q in tl.static_range(WORLD):
            if ok & (((wmask >> q) & 1) != 0):
                ok = lang.wait_ge(pad, wslot + q, epoch, q, err, rank, timeout_ns, site=1)
        if ok:
            o_begin = tl.load(row)
            o_end = tl.load(row + 1)
            for o in range(o_begin, o_end):
                orow = ops + o * 5
                doff = tl.load(orow)
                n = tl.load(orow + 1)
                comp = tl.load(orow + 2)
                s0 = tl.load(orow + 3)
                s1 = tl.load(orow + 4)
                dptr = data + doff
                p0 = lang.peer_ptr(data, tl.load(srcs + s0 * 2), bases, rank) + \
                    tl.load(srcs + s0 * 2 + 1)
                if s1 - s0 == 1:
                    # a copy: the bits move untouched
                    for start in range(pid * BLOCK, n, step):
                        offs = start + ar
                        m = offs < n
                        tl.store(dptr + offs, tl.load(p0 + offs, mask=m), mask=m)
                else:
                    for start in range(pid * BLOCK, n, step):
                        offs = start + ar
                        m = offs < n
                        acc = load_acc(p0 + offs, m, ACC_F32)
                        for s in range(s0 + 1, s1):
                            ps = lang.peer_ptr(data, tl.load(srcs + s * 2), bases, rank) + \
                                tl.load(srcs + s * 2 + 1)
                            acc = combine(acc, load_acc(ps + offs, m, ACC_F32), OP)
                        if OP == 1:
                            if comp != 0:
                                # integers: divided in fp32, truncated (as the fused kernels)
                                acc = finish(acc, OP, WORLD).to(acc.dtype)
                        tl.store(dptr + offs, acc.to(data.dtype.element_ty), mask=m)
            nmask = tl.load(row + 3)
            nslot = (g0 + p + 1) * WORLD + rank
            for q in tl.static_range(WORLD):
                if ((nmask >> q) & 1) != 0:
                    lang.signal_set(pad, nslot, epoch, q, bases, rank)
    # contract rule 2: every rank has started this call before it completes here
    for q in tl.static_range(WORLD):
        if q != rank:
            if ok:
                ok = lang.wait_ge(pad, g0 * WORLD + q, epoch, q, err, rank, timeout_ns, site=2)


# ---- host side -------------------------------------------------------------------------------
class Encoded:
    """One rank's plan for one call geometry: tables on the device and the buffer layout."""

    __slots__ = ("phases", "ops", "srcs", "nphases", "base", "starts", "total", "longest",
                 "nops")

    def __init__(self, phases, ops, srcs, nphases, base, starts, total, longest, nops):
        self.phases, self.ops, self.srcs = phases, ops, srcs
        self.nphases, self.base, self.starts = nphases, base, starts
        self.total, self.longest, self.nops = total, longest, nops


def _mask(ranks) -> int:
    m = 0
    for q in ranks:
        m |= 1 << q
    return m


def encode(collective: str, algo: str, world: int, root: int, rank: int, count: int,
           counts=None) -> tuple[list, list, list, dict, dict, int, int]:
    """The tables of ``rank``'s plan as Python lists, and the layout: ``(phase rows, op rows,
    src rows, base, starts, total, longest)``. ``base[buf]``: element offset of the buffer's
    region; ``starts[r][buf]``: chunk offsets of rank ``r``'s copy inside it (and its length
    as the last entry); ``total``: elements of the whole layout; ``longest``: the longest chunk
    of any buffer on any rank (sizes the grid: equal on every rank)."""
    from ....algorithms.collectives import chunk_lengths
    from ....algorithms.lower import lower

    plan = lower(collective, algo, world, root, rank)
    sched = plan.sched
    lens = [{b: chunk_lengths(sched, r, b, count, counts) for b in plan.names}
            for r in range(world)] if counts is not None else \
        [{b: chunk_lengths(sched, 0, b, count) for b in plan.names}] * world
    starts = [{b: list(accumulate(per[b], initial=0)) for b in plan.names} for per in lens]
    base, off = {}, 0
    for b in plan.names:
        base[b] = off
        size = max(st[b][-1] for st in starts)
        off += -(-size // ALIGN) * ALIGN
    longest = max((x for per in lens for v in per.values() for x in v), default=0)

    def at(r, loc):
        return base[loc.buf] + starts[r][loc.buf][loc.chunk]

    ph_rows, op_rows, src_rows = [], [], []
    for phase in plan.phases:
        first = len(op_rows)
        for op in phase.ops:
            n = lens[rank][op.dst.buf][op.dst.chunk]
            if not n:
                continue
            s_first = len(src_rows)
            if op.accumulate:
                src_rows.append([rank, at(rank, op.dst)])
            for r, loc in op.srcs:
                src_rows.append([r, at(r, loc)])
            op_rows.append([at(rank, op.dst), n, int(op.completes), s_first, len(src_rows)])
        ph_rows.append([first, len(op_rows), _mask(phase.waits), _mask(phase.notify)])
    ph_rows.append([len(op_rows), len(op_rows), _mask(plan.end_waits), 0])
    return ph_rows, op_rows, src_rows, base, starts, off, longest


#: ``(device, collective, algo, world, root, rank, count, counts) -> Encoded``
_CACHE: dict = {}
_CACHE_MAX = 256


def encoded(ctx, collective: str, algo: str, root: int, count: int, counts=None) -> Encoded:
    """The cached :class:`Encoded` plan of this rank for a call (tables on ``ctx.device``)."""
    key = (str(ctx.device), collective, algo, ctx.world_size, root, ctx.rank, count,
           None if counts is None else tuple(map(tuple, counts)))
    e = _CACHE.get(key)
    if e is None:
        ph, op, src, base, starts, total, longest = encode(
            collective, algo, ctx.world_size, root, ctx.rank, count, counts)
        flat = [x for r in ph for x in r] + [x for r in op for x in r] + \
            [x for r in src for x in r]
        t = torch.tensor(flat or [0], dtype=torch.int64).to(ctx.device)
        a, b = len(ph) * PH_COLS, len(ph) * PH_COLS + len(op) * OP_COLS
        # empty tables still need a valid pointer: point them at the phase table
        e = Encoded(t[:a], t[a:b] if op else t[:1], t[b:] if src else t[:1], len(ph) - 1,
                    base, starts, total, longest, len(op))
        if len(_CACHE) >= _CACHE_MAX:
            _CACHE.pop(next(iter(_CACHE)))
        _CACHE[key] = e
    return e


def _matrix(ctx, call) -> list[list[int]]:
    """all_to_all_v: every rank's send rows (host all-gather), after checking every rank's
    expected receive rows against them (every rank raises the same CommMismatch)."""
    from ....errors import CommMismatch

    w = ctx.world_size
    send = [int(c) for c in call.send_rows]
    expect = [-1] * w if call.recv_rows is None else [int(c) for c in call.recv_rows]
    rows = ctx.host_all_gather(send + expect)
    for r in range(w):
        for j in range(w):
            want = rows[r][w + j]
            if want >= 0 and want != rows[j][r]:
                raise CommMismatch(
                    f"all_to_all_v: ranks disagree on split sizes: rank {r} expects {want} "
                    f"rows from rank {j}, which sends it {rows[j][r]}")
    return [row[:w] for row in rows]


def _outputs(collective: str, rank: int, root: int) -> tuple[str, ...]:
    if collective == "reduce":
        return ("buf",) if rank == root else ()
    if collective == "broadcast":
        return ("buf",) if rank != root else ()
    if collective == "all_reduce":
        return ("buf",)
    if collective == "barrier":
        return ()
    return ("out",)


def _inputs(collective: str) -> tuple[str, ...]:
    from ....algorithms.collectives import COLLECTIVES

    return COLLECTIVES[collective].inputs


def launch_plan(ctx, call) -> None:
    """Launcher of the plan kernel for any ``(collective, algo)`` (registry contract)."""
    coll, algo = call.collective, call.algo
    w, me = ctx.world_size, ctx.rank
    counts = None
    bufs = dict(call.buffers)
    if coll == "all_to_all_v":
        rows = _matrix(ctx, call)
        counts = [[x * call.count for x in row] for row in rows]
        if bufs.get("out") is None:
            bufs["out"] = call.make_out(sum(rows[j][me] for j in range(w)))
    enc = encoded(ctx, coll, algo, call.root, call.count, counts)
    dtype = call.dtype.torch
    data = ctx.half("plan", max(enc.total, 1), dtype)
    for b in _inputs(coll):
        x = bufs.get(b)
        n = enc.starts[me][b][-1]
        if x is not None and n:
            data[enc.base[b]:enc.base[b] + n].copy_(x.reshape(-1)[:n])
    g = ctx.programs(max(enc.longest, 1))
    pad = ctx.signals(g * (enc.nphases + 1))
    bases, rank, err, tmo = ctx.kernel_args()
    op = op_code(call)
    if op == OP_AVG and w < 2:
        op = OP_SUM
    plan_kernel[(g,)](data, pad, enc.phases, enc.ops, enc.srcs, enc.nphases, bases, rank, err,
                      tmo, ctx.epoch, WORLD=w, BLOCK=ctx.block, OP=op,
                      ACC_F32=acc_f32(dtype))
    for b in _outputs(coll, me, call.root):
        y = bufs.get(b)
        n = enc.starts[me][b][-1]
        if y is not None and n:
            y.reshape(-1)[:n].copy_(data[enc.base[b]:enc.base[b] + n])


register_plan(launch_plan, dtypes=ALL_DTYPES, move_dtypes=MOVE_DTYPES, ops=REDUCE_OPS)


def _compile_entries():
    """COMPILE entries: fp32 (every op), fp16/bf16 (fp32 accumulation), int32 avg, a byte type
    (copies only), an odd world size."""
    from .common import signature

    sig = {"data": "*T", "pad": "*i64", "phases": "*i64", "ops": "*i64", "srcs": "*i64",
           "nphases": "i32", "bases": "*i64", "rank": "i32", "err": "*i64",
           "timeout_ns": "i64", "epoch": "i64"}

    def one(dt, world=8, op=OP_SUM):
        s = {k: v.replace("*T", "*i8") for k, v in sig.items()} if dt is torch.int8 else \
            signature(sig, dt)
        return (plan_kernel, s, {"WORLD": world, "BLOCK": 1024, "OP": op,
                                 "ACC_F32": acc_f32(dt)})

    out = [one(dt) for dt in ALL_DTYPES]
    out += [one(torch.float32, op=o) for o in range(1, 5)]
    out += [one(torch.bfloat16, op=OP_AVG), one(torch.int32, op=OP_AVG),
            one(torch.int8), one(torch.float32, world=3)]
    return out


COMPILE = _compile_entries()

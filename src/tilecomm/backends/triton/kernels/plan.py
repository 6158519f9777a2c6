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
  symmetric scratch half (``ctx.halves("plan", ...)``; the kernel uses half ``epoch % 2`` of
  the epoch it loads, NOTE [device epochs] in context.py), at the same offset on every rank. A region is as long as the longest copy of that buffer on any rank (all_to_all_v:
  chunk lengths from the count matrix differ between ranks); rank ``r``'s chunk ``c`` starts at
  ``region + sum(r's chunks before c)``, which every rank computes from the matrix.
* Staging, in the kernel (nothing is copied on the host, so a CUDA graph replay stages the
  inputs into the half of its own epoch): the ``io`` table lists the caller's input chunks
  (copied into their regions before the arrival signal) and output chunks (copied out after
  the end waits: ``buf`` / ``out``; reduce: the root's only; broadcast: the non-roots'), one
  row ``(region element offset, caller element offset, length)`` per chunk. Program ``pid``
  copies blocks ``pid, pid + G, ...`` of each chunk, the blocks it handles in the ops, so it
  stages what the peers' programs ``pid`` read and copies out what it (or the peers'
  programs ``pid``, which it waited for) wrote.
* Tables (int64, on the device, cached per context and ``(collective, algo, root, count,
  counts)``): ``io[nin + nout, 3]`` (above), ``phases[P + 1, 4]`` = (first op, end op, wait mask, notify mask) per phase, and
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
read is in the parity half of the ``plan`` scratch (never the caller's memory). Epoch: loaded
from ``ctx.epoch_dev``; the kernel launches even for empty calls (rule 2 then still holds).

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
from ...base import check_split_sizes
from ..registry import ALL_DTYPES, REDUCE_OPS, register_plan
from .common import (OP_AVG, OP_SUM, acc_f32, combine, finish, load_acc, load_epoch, op_code,
                     parity_half)

#: data-movement collectives also take the byte types
MOVE_DTYPES = ALL_DTYPES + (torch.uint8, torch.int8)

#: every buffer region starts at a multiple of this many elements (vector-friendly)
ALIGN = 64

#: columns of the tables
PH_COLS, OP_COLS, SRC_COLS, IO_COLS = 4, 5, 2, 3


@triton.jit
def _copy_chunks(io, first, last, dst, dst_col: tl.constexpr, src, src_col: tl.constexpr,
                 pid, step, BLOCK: tl.constexpr):
    """``dst[row[dst_col] + i] = src[row[src_col] + i]`` for ``i < row[2]``, rows ``first ..
    last - 1`` of ``io``, blocks ``pid, pid + G, ...`` of each chunk (``step = G * BLOCK``)."""
    ar = tl.arange(0, BLOCK)
    for k in range(first, last):
        row = io + k * 3
        d = dst + tl.load(row + dst_col)
        sp = src + tl.load(row + src_col)
        n = tl.load(row + 2)
        for start in range(pid * BLOCK, n, step):
            offs = start + ar
            m = offs < n
            tl.store(d + offs, tl.load(sp + offs, mask=m), mask=m)


@triton.jit(do_not_specialize=["half", "nin", "nout", "nphases"])
def plan_kernel(data, half, x, y, io, nin, nout, pad, phases, ops, srcs, nphases, heap, epoch_ptr,
                WORLD: tl.constexpr, BLOCK: tl.constexpr, OP: tl.constexpr, ACC_F32: tl.constexpr):
    """Run one rank's lowered plan (module docstring). ``data``: this rank's plan scratch,
    both parity halves (``half`` elements apart; symmetric; every element offset in the
    tables is relative to the half of this epoch). ``x``/``y``: the caller's input and
    output (local), ``nin``/``nout`` rows of ``io`` for each. ``nphases``: ``P`` (the phase
    table has ``P + 1`` rows, the last one the end waits)."""
    rank = lang.my_rank(heap)
    epoch = load_epoch(epoch_ptr)
    data = parity_half(data, half, epoch)
    pid = tl.program_id(0)
    G = tl.num_programs(0)
    step = G * BLOCK
    g0 = pid * (nphases + 1)
    ar = tl.arange(0, BLOCK)
    # stage this program's blocks of the inputs, then (release) tell every peer
    _copy_chunks(io, 0, nin, data, 0, x, 1, pid, step, BLOCK)
    tl.debug_barrier()
    for q in tl.static_range(WORLD):
        if q != rank:
            lang.signal_set(pad, g0 * WORLD + rank, epoch, q, heap)
    ok = tl.cast(1, tl.int1)
    for p in range(0, nphases + 1):
        row = phases + p * 4
        wmask = tl.load(row + 2)
        wslot = (g0 + p) * WORLD
        for q in tl.static_range(WORLD):
            if ok & (((wmask >> q) & 1) != 0):
                ok = lang.wait_ge(pad, wslot + q, epoch, q, heap, site=1)
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
                p0 = lang.peer_ptr(data, tl.load(srcs + s0 * 2), heap) + \
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
                            ps = lang.peer_ptr(data, tl.load(srcs + s * 2), heap) + \
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
                    lang.signal_set(pad, nslot, epoch, q, heap)
    # contract rule 2: every rank has started this call before it completes here
    for q in tl.static_range(WORLD):
        if q != rank:
            if ok:
                ok = lang.wait_ge(pad, g0 * WORLD + q, epoch, q, heap, site=2)
    if ok:
        tl.debug_barrier()          # the program's (and its waited-for peers') writes first
        _copy_chunks(io, nin, nin + nout, y, 1, data, 0, pid, step, BLOCK)


# ---- host side -------------------------------------------------------------------------------
class Encoded:
    """One rank's plan for one call geometry: tables on the device and the buffer layout."""

    __slots__ = ("phases", "ops", "srcs", "nphases", "base", "starts", "total", "longest",
                 "nops", "io", "nin", "nout")

    def __init__(self, phases, ops, srcs, nphases, base, starts, total, longest, nops,
                 io=None, nin=0, nout=0):
        self.phases, self.ops, self.srcs = phases, ops, srcs
        self.nphases, self.base, self.starts = nphases, base, starts
        self.total, self.longest, self.nops = total, longest, nops
        self.io, self.nin, self.nout = io, nin, nout


#: waits and notifies travel as int64 bit masks of ranks
MAX_WORLD = 63


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
#: encoded plans a context keeps (``KernelContext.encodings``)
_CACHE_MAX = 256


def io_rows(base: dict, starts: dict, bufs) -> list[list[int]]:
    """``(region element offset, caller element offset, length)`` of every non-empty chunk of
    the buffers ``bufs`` of one rank (``starts``: that rank's chunk offsets)."""
    rows = []
    for b in bufs:
        st = starts[b]
        for c in range(len(st) - 1):
            if st[c + 1] > st[c]:
                rows.append([base[b] + st[c], st[c], st[c + 1] - st[c]])
    return rows


def encoded(ctx, collective: str, algo: str, root: int, count: int, counts=None) -> Encoded:
    """The cached :class:`Encoded` plan of this rank for a call (tables on ``ctx.device``)."""
    key = (collective, algo, root, count, None if counts is None else tuple(map(tuple, counts)))
    cache = ctx.encodings
    e = cache.get(key)
    if e is None:
        ph, op, src, base, starts, total, longest = encode(
            collective, algo, ctx.world_size, root, ctx.rank, count, counts)
        ins = io_rows(base, starts[ctx.rank], _inputs(collective))
        outs = io_rows(base, starts[ctx.rank], _outputs(collective, ctx.rank, root))
        flat = [x for r in ph for x in r] + [x for r in op for x in r] + \
            [x for r in src for x in r] + [x for r in ins + outs for x in r]
        t = torch.tensor(flat or [0], dtype=torch.int64).to(ctx.device)
        a, b = len(ph) * PH_COLS, len(ph) * PH_COLS + len(op) * OP_COLS
        c = b + len(src) * SRC_COLS
        # empty tables still need a valid pointer: point them at the phase table
        e = Encoded(t[:a], t[a:b] if op else t[:1], t[b:c] if src else t[:1], len(ph) - 1,
                    base, starts, total, longest, len(op), t[c:] if ins or outs else t[:1],
                    len(ins), len(outs))
        if len(cache) >= _CACHE_MAX and not ctx.graph_captured:
            # (after a CUDA graph capture nothing is evicted: a replay reads these tables)
            cache.pop(next(iter(cache)))
        cache[key] = e
    return e


def _matrix(ctx, call) -> list[list[int]]:
    """all_to_all_v: every rank's send rows (host all-gather), after checking every rank's
    expected receive rows against them (every rank raises the same CommMismatch)."""
    w = ctx.world_size
    send = [int(c) for c in call.send_rows]
    expect = [-1] * w if call.recv_rows is None else [int(c) for c in call.recv_rows]
    rows = ctx.host_all_gather(send + expect)
    check_split_sizes([row[:w] for row in rows], [row[w:] for row in rows], "all_to_all_v")
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
    data, half = ctx.halves("plan", max(enc.total, 1), dtype)
    ins, outs = _inputs(coll), _outputs(coll, me, call.root)
    assert len(ins) <= 1 and len(outs) <= 1, (coll, ins, outs)
    x = bufs.get(ins[0]) if enc.nin else None
    y = bufs.get(outs[0]) if enc.nout else None
    x = data if x is None else x.reshape(-1)     # a stand-in pointer when no row uses it
    y = data if y is None else y.reshape(-1)
    g = ctx.programs(max(enc.longest, 1))
    pad = ctx.signals(g * (enc.nphases + 1))
    op = op_code(call)
    if op == OP_AVG and w < 2:
        op = OP_SUM
    plan_kernel[(g,)](data, half, x, y, enc.io, enc.nin, enc.nout, pad, enc.phases, enc.ops,
                      enc.srcs, enc.nphases, ctx.handle, ctx.epoch_dev, WORLD=w, BLOCK=ctx.block,
                      OP=op, ACC_F32=acc_f32(dtype))


register_plan(launch_plan, dtypes=ALL_DTYPES, move_dtypes=MOVE_DTYPES, ops=REDUCE_OPS)


def _compile_entries():
    """COMPILE entries: fp32 (every op), fp16/bf16 (fp32 accumulation), int32 avg, a byte type
    (copies only), an odd world size."""
    from .common import signature

    sig = {"data": "*T", "half": "i32", "x": "*T", "y": "*T", "io": "*i64", "nin": "i32",
           "nout": "i32", "pad": "*i64", "phases": "*i64", "ops": "*i64", "srcs": "*i64",
           "nphases": "i32", "heap": "*i64", "epoch_ptr": "*i64"}

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

"""all_gather and reduce_scatter kernels: direct and ring (the schedules of the same names).

Program ``pid`` of a launch owns blocks ``pid, pid + G, ...`` of every chunk; it meets only
program ``pid`` of the other ranks (per-program slot groups), so the interpreter's one-program-
at-a-time order cannot deadlock. ``n`` is the input length (all_gather) or the chunk length
(reduce_scatter: input ``W * m``, output ``m``).

all_gather direct (``out_r[j] = in_j``)::

    stage own blocks of in -> src_r (half epoch % 2 of "all_gather.direct"; zero copy: in)
    barrier group pid;  out[j*n + blk] = src_j[blk] for every j;  (zero copy) barrier group G+pid

all_gather ring (step s copies chunk ``r - s`` from the left neighbour ``r - 1``)::

    ring_r[r] = out[r] = in               (ring: half epoch % 2 of "all_gather.ring")
    signal right, group pid*W + 0
    step s = 1..W-1: wait left's group pid*W + s-1; c = r - s;
                     ring_r[c] = out[c] = ring_{r-1}[c]; signal right, group pid*W + s

reduce_scatter direct (``out_r = in_0[r] + ... + in_{W-1}[r]``, rank order)::

    stage own blocks of every chunk of in -> src_r (or zero copy)
    barrier group pid;  out = sum_q src_q[r*m + blk];  (zero copy) barrier group G+pid

reduce_scatter ring (step s: ``tmp_r[c] = in_r[c] + left's partial of c``, ``c = r - 2 - s``;
the last step lands chunk r in out; each step adds in fp32 for fp16/bf16 and stores its partial
in the input dtype, as the schedule's reductions do, so the bits are the plan's)::

    stage (or zero copy); signal right, group pid*W + 0
    step s = 0..W-2: wait left's group pid*W + s; c = r - 2 - s;
                     p = src_r[c] + (s == 0 ? src_{r-1}[c] : tmp_{r-1}[c])
                     s < W-2: tmp_r[c] = p, signal right group pid*W + s+1;  else out = p
    (zero copy) barrier group W*G + pid

Parity halves are chosen in the kernel from the epoch it loads (``base + (epoch % 2) *
half``, NOTE [device epochs] in context.py), so a CUDA graph replay alternates them too.

Rules (contract in registry.py): data peers read lives in parity halves, or in the caller's
heap tensor, in which case a final barrier keeps the caller from overwriting it while a peer
still reads it. Every rank's input reaches every rank, so a call finishes nowhere before every
rank started it.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from tilecomm.device import lang

from ..registry import ALL_DTYPES, REDUCE_OPS, check_int32, kernel
from .common import (COMMON_SIG, OP_SUM, acc_f32, collective_jit, combine, copy_blocks,
                     finish, load_acc, load_epoch, op_code, parity_half, reduce_blocks,
                     signature, store_block)


@triton.jit
def _gather_peers(out, src, n, first, step, heap, WORLD: tl.constexpr, BLOCK: tl.constexpr):
    for j in tl.static_range(WORLD):
        copy_blocks(out + j * n, lang.peer_ptr(src, j, heap), n, first, step, BLOCK)


@collective_jit
def all_gather_direct_kernel(x, out, src, half, pad, n, heap, epoch_ptr, WORLD: tl.constexpr,
                             BLOCK: tl.constexpr, STAGE: tl.constexpr):
    ALIGN: tl.constexpr = 128 // x.dtype.element_ty.primitive_bitwidth   # elements / 16 B
    epoch = load_epoch(epoch_ptr)
    src = parity_half(src, half, epoch)
    pid = tl.program_id(0)
    G = tl.num_programs(0)
    step = G * BLOCK
    if STAGE:
        copy_blocks(src, x, n, pid * BLOCK, step, BLOCK)
    ok = lang.barrier(pad, pid * WORLD, epoch, heap, WORLD, site=1)
    if ok:
        if n % ALIGN == 0:      # out + j * n is 16-byte aligned: say so (128-bit stores)
            _gather_peers(out, src, n // ALIGN * ALIGN, pid * BLOCK, step, heap, WORLD, BLOCK)
        else:
            _gather_peers(out, src, n, pid * BLOCK, step, heap, WORLD, BLOCK)
        if not STAGE:       # peers read our heap tensor: keep it until they are done
            lang.barrier(pad, (G + pid) * WORLD, epoch, heap, WORLD, site=2)


@triton.jit
def _ring_copy_block(ring, out, lsrc, offs, n, FULL: tl.constexpr):
    m = offs < n
    v = load_acc(lsrc + offs, m, False, FULL)
    store_block(ring + offs, v, m, FULL)
    store_block(out + offs, v, m, FULL)


@collective_jit
def all_gather_ring_kernel(x, out, ring, half, pad, n, heap, epoch_ptr, WORLD: tl.constexpr,
                           BLOCK: tl.constexpr):
    rank = lang.my_rank(heap)
    epoch = load_epoch(epoch_ptr)
    ring = parity_half(ring, half, epoch)
    pid = tl.program_id(0)
    step = tl.num_programs(0) * BLOCK
    right = (rank + 1) % WORLD
    left = (rank + WORLD - 1) % WORLD
    g0 = pid * WORLD
    copy_blocks(ring + rank * n, x, n, pid * BLOCK, step, BLOCK)
    copy_blocks(out + rank * n, x, n, pid * BLOCK, step, BLOCK)
    ok = tl.cast(1, tl.int1)
    if WORLD > 1:
        lang.signal_set(pad, g0 * WORLD + rank, epoch, right, heap)
    for s in tl.static_range(1, WORLD):
        if ok:
            ok = lang.wait_ge(pad, (g0 + s - 1) * WORLD + left, epoch, left, heap, site=s)
        if ok:
            c = (rank + WORLD - s) % WORLD
            lsrc = lang.peer_ptr(ring, left, heap) + c * n
            for start in range(pid * BLOCK, n, step):
                offs = start + tl.arange(0, BLOCK)
                if start + BLOCK <= n:
                    _ring_copy_block(ring + c * n, out + c * n, lsrc, offs, n, True)
                else:
                    _ring_copy_block(ring + c * n, out + c * n, lsrc, offs, n, False)
            if s < WORLD - 1:
                lang.signal_set(pad, (g0 + s) * WORLD + rank, epoch, right, heap)


@triton.jit
def _stage_chunks(src, x, m, first, step, WORLD: tl.constexpr, BLOCK: tl.constexpr):
    for c in tl.static_range(WORLD):
        copy_blocks(src + c * m, x + c * m, m, first, step, BLOCK)


@collective_jit
def reduce_scatter_direct_kernel(x, out, src, half, pad, m, heap, epoch_ptr, WORLD: tl.constexpr,
                                 BLOCK: tl.constexpr, OP: tl.constexpr, ACC_F32: tl.constexpr,
                                 STAGE: tl.constexpr):
    rank = lang.my_rank(heap)
    ALIGN: tl.constexpr = 128 // x.dtype.element_ty.primitive_bitwidth   # elements / 16 B
    epoch = load_epoch(epoch_ptr)
    src = parity_half(src, half, epoch)
    pid = tl.program_id(0)
    G = tl.num_programs(0)
    step = G * BLOCK
    # chunk c starts at c * m: 16-byte aligned when m is a multiple of ALIGN, which the
    # compiler learns from m // ALIGN * ALIGN (128-bit peer loads); else scalar
    if STAGE:
        if m % ALIGN == 0:
            _stage_chunks(src, x, m // ALIGN * ALIGN, pid * BLOCK, step, WORLD, BLOCK)
        else:
            _stage_chunks(src, x, m, pid * BLOCK, step, WORLD, BLOCK)
    ok = lang.barrier(pad, pid * WORLD, epoch, heap, WORLD, site=1)
    if ok:
        if m % ALIGN == 0:
            mA = m // ALIGN * ALIGN
            reduce_blocks(out, src + rank * mA, mA, pid * BLOCK, step, heap, WORLD, BLOCK, OP,
                          ACC_F32)
        else:
            reduce_blocks(out, src + rank * m, m, pid * BLOCK, step, heap, WORLD, BLOCK, OP,
                          ACC_F32)
        if not STAGE:
            lang.barrier(pad, (G + pid) * WORLD, epoch, heap, WORLD, site=2)


@triton.jit
def _ring_reduce_block(out, tmp, mine_p, lsrc, offs, m, s: tl.constexpr, OP: tl.constexpr,
                       ACC_F32: tl.constexpr, WORLD: tl.constexpr, FULL: tl.constexpr):
    """One block of reduce_scatter ring's step ``s`` (constexpr): ``mine (op) left's``,
    stored into ``tmp`` (``s < WORLD - 2``) or, finished, into ``out``."""
    mk = offs < m
    mine = load_acc(mine_p + offs, mk, ACC_F32, FULL)
    theirs = load_acc(lsrc + offs, mk, ACC_F32, FULL)
    p = combine(mine, theirs, OP)
    if s == WORLD - 2:
        p = finish(p, OP, WORLD)
        store_block(out + offs, p.to(out.dtype.element_ty), mk, FULL)
    else:
        store_block(tmp + offs, p.to(tmp.dtype.element_ty), mk, FULL)


@collective_jit
def reduce_scatter_ring_kernel(x, out, src, src_half, tmp, tmp_half, pad, m, heap, epoch_ptr,
                               WORLD: tl.constexpr, BLOCK: tl.constexpr, OP: tl.constexpr,
                               ACC_F32: tl.constexpr, STAGE: tl.constexpr):
    rank = lang.my_rank(heap)
    epoch = load_epoch(epoch_ptr)
    src = parity_half(src, src_half, epoch)
    tmp = parity_half(tmp, tmp_half, epoch)
    pid = tl.program_id(0)
    G = tl.num_programs(0)
    step = G * BLOCK
    right = (rank + 1) % WORLD
    left = (rank + WORLD - 1) % WORLD
    g0 = pid * WORLD
    if STAGE:
        # not ``c``: a constexpr loop variable that the ring steps below redefine as a
        # runtime int fails to compile on a GPU (the interpreter does not notice)
        for sc in tl.static_range(WORLD):
            copy_blocks(src + sc * m, x + sc * m, m, pid * BLOCK, step, BLOCK)
    ok = tl.cast(1, tl.int1)
    if WORLD == 1:
        for start in range(pid * BLOCK, m, step):
            offs = start + tl.arange(0, BLOCK)
            mk = offs < m
            v = finish(load_acc(src + offs, mk, ACC_F32), OP, WORLD)
            tl.store(out + offs, v.to(out.dtype.element_ty), mask=mk)
    else:
        lang.signal_set(pad, g0 * WORLD + rank, epoch, right, heap)
        for s in tl.static_range(WORLD - 1):
            if ok:
                ok = lang.wait_ge(pad, (g0 + s) * WORLD + left, epoch, left, heap, site=s + 1)
            if ok:
                c = (rank + 2 * WORLD - 2 - s) % WORLD
                if s == 0:
                    lsrc = lang.peer_ptr(src, left, heap) + c * m
                else:
                    lsrc = lang.peer_ptr(tmp, left, heap) + c * m
                for start in range(pid * BLOCK, m, step):
                    offs = start + tl.arange(0, BLOCK)
                    if start + BLOCK <= m:
                        _ring_reduce_block(out, tmp + c * m, src + c * m, lsrc, offs, m, s, OP,
                                           ACC_F32, WORLD, True)
                    else:
                        _ring_reduce_block(out, tmp + c * m, src + c * m, lsrc, offs, m, s, OP,
                                           ACC_F32, WORLD, False)
                if s < WORLD - 2:
                    lang.signal_set(pad, (g0 + s + 1) * WORLD + rank, epoch, right, heap)
        if not STAGE:
            lang.barrier(pad, (WORLD * G + pid) * WORLD, epoch, heap, WORLD, site=WORLD + 1)


@kernel("all_gather", "direct", dtypes=ALL_DTYPES)
def all_gather_direct(ctx, call) -> None:
    x, out = call.buffers["in"], call.buffers["out"]
    n = x.numel()
    if n == 0:
        return
    check_int32("all_gather", "direct", ctx.world_size * n)
    g = ctx.programs(n)
    pad = ctx.signals(2 * g)
    src, half = (x, 0) if ctx.zero_copy else ctx.halves("all_gather.direct", n, x.dtype)
    all_gather_direct_kernel[(g,)](x, out, src, half, pad, n, ctx.handle, ctx.epoch_dev,
                                   WORLD=ctx.world_size, BLOCK=ctx.block, STAGE=not ctx.zero_copy)


@kernel("all_gather", "ring", dtypes=ALL_DTYPES)
def all_gather_ring(ctx, call) -> None:
    x, out = call.buffers["in"], call.buffers["out"]
    n, w = x.numel(), ctx.world_size
    if n == 0:
        return
    check_int32("all_gather", "ring", w * n)
    g = ctx.programs(n)
    pad = ctx.signals(g * w)
    ring, half = ctx.halves("all_gather.ring", w * n, x.dtype)
    all_gather_ring_kernel[(g,)](x, out, ring, half, pad, n, ctx.handle, ctx.epoch_dev, WORLD=w,
                                 BLOCK=ctx.block)


@kernel("reduce_scatter", "direct", dtypes=ALL_DTYPES, ops=REDUCE_OPS)
def reduce_scatter_direct(ctx, call) -> None:
    x, out = call.buffers["in"], call.buffers["out"]
    w = ctx.world_size
    m = x.numel() // w
    if m == 0:
        return
    check_int32("reduce_scatter", "direct", w * m)
    g = ctx.programs(m)
    pad = ctx.signals(2 * g)
    src, half = (x, 0) if ctx.zero_copy else ctx.halves("reduce_scatter.direct", w * m, x.dtype)
    reduce_scatter_direct_kernel[(g,)](x, out, src, half, pad, m, ctx.handle, ctx.epoch_dev,
                                       WORLD=w, BLOCK=ctx.block, OP=op_code(call),
                                       ACC_F32=acc_f32(x.dtype), STAGE=not ctx.zero_copy)


@kernel("reduce_scatter", "ring", dtypes=ALL_DTYPES, ops=REDUCE_OPS)
def reduce_scatter_ring(ctx, call) -> None:
    x, out = call.buffers["in"], call.buffers["out"]
    w = ctx.world_size
    m = x.numel() // w
    if m == 0:
        return
    check_int32("reduce_scatter", "ring", w * m)
    g = ctx.programs(m)
    pad = ctx.signals(g * (w + 1))
    src, src_half = (x, 0) if ctx.zero_copy else \
        ctx.halves("reduce_scatter.ring.src", w * m, x.dtype)
    # partials in the input dtype: the schedule rounds each step's reduction (NOTE
    # [reduction order] in algorithms/lower.py), so fp32 partials would give other bits
    tmp, tmp_half = ctx.halves("reduce_scatter.ring.tmp", w * m, x.dtype)
    reduce_scatter_ring_kernel[(g,)](x, out, src, src_half, tmp, tmp_half, pad, m, ctx.handle,
                                     ctx.epoch_dev, WORLD=w, BLOCK=ctx.block, OP=op_code(call),
                                     ACC_F32=acc_f32(x.dtype), STAGE=not ctx.zero_copy)


def _compile_entries():
    """COMPILE entries: every kernel in every registered dtype (fp16/bf16 take the
    fp32-accumulating path), the reducing ones with every op in fp32 and int32, zero copy
    (STAGE=0) and an odd world size."""

    def one(dt, world=8, op=OP_SUM, stage=1, gathers=True):
        out = []
        if gathers:
            base = {"x": "*T", "out": "*T", "src": "*T", "half": "i32", "n": "i32",
                    **COMMON_SIG}
            out.append((all_gather_direct_kernel, signature(base, dt),
                        {"WORLD": world, "BLOCK": 1024, "STAGE": stage}))
            out.append((all_gather_ring_kernel,
                        signature({"x": "*T", "out": "*T", "ring": "*T", "half": "i32",
                                   "n": "i32",
                                   **COMMON_SIG}, dt), {"WORLD": world, "BLOCK": 1024}))
        rs = {"x": "*T", "out": "*T", "src": "*T", "half": "i32", "m": "i32", **COMMON_SIG}
        out.append((reduce_scatter_direct_kernel, signature(rs, dt),
                    {"WORLD": world, "BLOCK": 1024, "OP": op, "ACC_F32": acc_f32(dt),
                     "STAGE": stage}))
        rr = {"x": "*T", "out": "*T", "src": "*T", "src_half": "i32", "tmp": "*T",
              "tmp_half": "i32", "m": "i32", **COMMON_SIG}
        out.append((reduce_scatter_ring_kernel, signature(rr, dt),
                    {"WORLD": world, "BLOCK": 1024, "OP": op, "ACC_F32": acc_f32(dt),
                     "STAGE": stage}))
        return out

    out = []
    for dt in ALL_DTYPES:
        out += one(dt)
    for dt in (torch.float32, torch.int32, torch.float16):
        for op in range(1, 5):
            out += one(dt, op=op, gathers=False)
    out += one(torch.float32, world=3, stage=0)
    return out


COMPILE = _compile_entries()

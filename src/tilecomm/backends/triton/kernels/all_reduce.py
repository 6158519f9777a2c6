"""all_reduce kernels: one_shot and two_shot (the schedules of the same names).

one_shot (``algorithms/one_shot.py``: ``tmp_r = buf_r``, then ``buf_r = tmp_0 + ... +
tmp_{W-1}``). Program ``pid`` owns blocks ``pid, pid + G, ...`` of the vector:

    stage   own blocks of x -> stage_r (half epoch % 2 of symmetric scratch "one_shot")
    barrier slot group pid (publishes the staging; every rank has started the call)
    reduce  out[blk] = stage_0[blk] + stage_1[blk] + ...   (rank order, fp32 for fp16/bf16)

One synchronization. The staging half alternates with the epoch's parity, so a peer that
starts the next call cannot overwrite what a slow rank still reads (contract rules 2-3). A
heap tensor is staged too: the call is in place, and reading peers' tensors while they
overwrite them would need a second barrier, which costs more than a local copy at the sizes
one_shot is for.

two_shot (``algorithms/two_shot.py``: reduce-scatter then all-gather; rank r owns chunk r of
``[c*n//W, (c+1)*n//W)``). Program ``pid`` owns blocks ``pid, pid + G, ...`` of every chunk:

    stage    own blocks of every chunk of x -> src_r (skipped with zero copy: src is x)
    barrier  group pid                       (all sources published)
    reduce   red_r[chunk r] = src_0[chunk r] + ... + src_{W-1}[chunk r]   (rank order)
    barrier  group G + pid                   (all reduced chunks published, all reads of src done)
    gather   out[chunk j] = red_j[chunk j]  for every j

Each chunk is reduced once, by its owner, so every rank gets the same bits. Writing ``out``
(which may be the caller's heap tensor that peers read) only after the second barrier makes
zero copy safe; ``red`` is rewritten only after the next call's first barrier.
"""

from __future__ import annotations

import triton
import triton.language as tl

from tilecomm.device import lang

from ..registry import ALL_DTYPES, REDUCE_OPS, check_int32, kernel
from .common import (COMMON_SIG, OP_SUM, acc_f32, combine, finish, load_acc, op_code,
                     signature)


@triton.jit
def one_shot_all_reduce_kernel(x, out, stage, pad, n, bases, rank, err, timeout_ns, epoch,
                               WORLD: tl.constexpr, BLOCK: tl.constexpr, OP: tl.constexpr,
                               ACC_F32: tl.constexpr):
    pid = tl.program_id(0)
    step = tl.num_programs(0) * BLOCK
    for start in range(pid * BLOCK, n, step):
        offs = start + tl.arange(0, BLOCK)
        m = offs < n
        tl.store(stage + offs, tl.load(x + offs, mask=m), mask=m)
    if lang.barrier(pad, pid * WORLD, epoch, bases, rank, err, timeout_ns, WORLD, site=1):
        for start in range(pid * BLOCK, n, step):
            offs = start + tl.arange(0, BLOCK)
            m = offs < n
            acc = load_acc(lang.peer_ptr(stage, 0, bases, rank) + offs, m, ACC_F32)
            for q in tl.static_range(1, WORLD):
                v = load_acc(lang.peer_ptr(stage, q, bases, rank) + offs, m, ACC_F32)
                acc = combine(acc, v, OP)
            acc = finish(acc, OP, WORLD)
            tl.store(out + offs, acc.to(out.dtype.element_ty), mask=m)


@triton.jit
def two_shot_all_reduce_kernel(x, out, src, red, pad, n, bases, rank, err, timeout_ns, epoch,
                               WORLD: tl.constexpr, BLOCK: tl.constexpr, OP: tl.constexpr,
                               ACC_F32: tl.constexpr, STAGE: tl.constexpr):
    pid = tl.program_id(0)
    G = tl.num_programs(0)
    step = G * BLOCK
    cmax = (n + WORLD - 1) // WORLD
    if STAGE:
        for c in tl.static_range(WORLD):
            c0 = c * n // WORLD
            clen = (c + 1) * n // WORLD - c0
            for start in range(pid * BLOCK, cmax, step):
                offs = start + tl.arange(0, BLOCK)
                m = offs < clen
                tl.store(src + c0 + offs, tl.load(x + c0 + offs, mask=m), mask=m)
    ok = lang.barrier(pad, pid * WORLD, epoch, bases, rank, err, timeout_ns, WORLD, site=1)
    if ok:
        r0 = rank * n // WORLD
        rlen = (rank + 1) * n // WORLD - r0
        for start in range(pid * BLOCK, cmax, step):
            offs = start + tl.arange(0, BLOCK)
            m = offs < rlen
            acc = load_acc(lang.peer_ptr(src, 0, bases, rank) + r0 + offs, m, ACC_F32)
            for q in tl.static_range(1, WORLD):
                v = load_acc(lang.peer_ptr(src, q, bases, rank) + r0 + offs, m, ACC_F32)
                acc = combine(acc, v, OP)
            acc = finish(acc, OP, WORLD)
            tl.store(red + r0 + offs, acc.to(red.dtype.element_ty), mask=m)
        ok = lang.barrier(pad, (G + pid) * WORLD, epoch, bases, rank, err, timeout_ns, WORLD,
                          site=2)
    if ok:
        for c in tl.static_range(WORLD):
            c0 = c * n // WORLD
            clen = (c + 1) * n // WORLD - c0
            peer_red = lang.peer_ptr(red, c, bases, rank) + c0
            for start in range(pid * BLOCK, cmax, step):
                offs = start + tl.arange(0, BLOCK)
                m = offs < clen
                tl.store(out + c0 + offs, tl.load(peer_red + offs, mask=m), mask=m)


@kernel("all_reduce", "one_shot", dtypes=ALL_DTYPES, ops=REDUCE_OPS)
def one_shot(ctx, call) -> None:
    x = call.buffers["buf"]
    n = x.numel()
    if n == 0:
        return
    check_int32("all_reduce", "one_shot", n)
    g = ctx.programs(n)
    pad = ctx.signals(g)
    stage = ctx.half("all_reduce.one_shot", n, x.dtype)
    bases, rank, err, tmo = ctx.kernel_args()
    one_shot_all_reduce_kernel[(g,)](x, x, stage, pad, n, bases, rank, err, tmo, ctx.epoch,
                                     WORLD=ctx.world_size, BLOCK=ctx.block, OP=op_code(call),
                                     ACC_F32=acc_f32(x.dtype))


@kernel("all_reduce", "two_shot", dtypes=ALL_DTYPES, ops=REDUCE_OPS)
def two_shot(ctx, call) -> None:
    x = call.buffers["buf"]
    n = x.numel()
    if n == 0:
        return
    w = ctx.world_size
    check_int32("all_reduce", "two_shot", w * n)     # (c + 1) * n for c < w, in int32
    g = ctx.programs(-(-n // w))
    pad = ctx.signals(2 * g)
    src = x if ctx.zero_copy else ctx.half("all_reduce.two_shot.src", n, x.dtype)
    red = ctx.scratch("all_reduce.two_shot.red", n, x.dtype)
    bases, rank, err, tmo = ctx.kernel_args()
    two_shot_all_reduce_kernel[(g,)](x, x, src, red, pad, n, bases, rank, err, tmo, ctx.epoch,
                                     WORLD=w, BLOCK=ctx.block, OP=op_code(call),
                                     ACC_F32=acc_f32(x.dtype), STAGE=not ctx.zero_copy)


def _compile_entries():
    """COMPILE entries: both kernels in every registered dtype (fp16/bf16 take the
    fp32-accumulating path), every op in fp32 and int32 (min/max/avg lower differently for
    integers), zero copy (STAGE=0) and an odd world size."""
    import torch

    def one(dt, world=8, op=OP_SUM, stage=1):
        sig1 = signature({"x": "*T", "out": "*T", "stage": "*T", "n": "i32", **COMMON_SIG}, dt)
        sig2 = signature({"x": "*T", "out": "*T", "src": "*T", "red": "*T", "n": "i32",
                          **COMMON_SIG}, dt)
        return [(one_shot_all_reduce_kernel, sig1,
                 {"WORLD": world, "BLOCK": 1024, "OP": op, "ACC_F32": acc_f32(dt)}),
                (two_shot_all_reduce_kernel, sig2,
                 {"WORLD": world, "BLOCK": 1024, "OP": op, "ACC_F32": acc_f32(dt),
                  "STAGE": stage})]

    out = []
    for dt in ALL_DTYPES:
        out += one(dt)
    for dt in (torch.float32, torch.int32, torch.bfloat16):
        for op in range(1, 5):
            out += one(dt, op=op)
    out += one(torch.float32, world=3, stage=0)
    return out


COMPILE = _compile_entries()

"""all_reduce kernels: one_shot and two_shot (the schedules of the same names).

one_shot (``algorithms/one_shot.py``: ``tmp_r = buf_r``, then ``buf_r = tmp_0 + ... +
tmp_{W-1}``). Program ``pid`` owns blocks ``pid, pid + G, ...`` of the vector:

    stage   own blocks of x -> stage_r (half epoch % 2 of symmetric scratch "one_shot",
            chosen in the kernel from the epoch it loads: NOTE [device epochs])
    barrier slot group pid (publishes the staging; every rank has started the call)
    reduce  out[blk] = stage_0[blk] + stage_1[blk] + ...   (rank order, fp32 for fp16/bf16)

One synchronization. The staging half alternates with the epoch's parity, so a peer that
starts the next call cannot overwrite what a slow rank still reads (contract rules 2-3). A
heap tensor is staged too: the call is in place, and reading peers' tensors while they
overwrite them would need a second barrier, which costs more than a local copy at the sizes
one_shot is for.

two_shot (``algorithms/two_shot.py``: reduce-scatter then all-gather; rank r owns chunk r,
``[chunk_start(r), chunk_start(r + 1))``: the boundaries ``c*n//W`` rounded down to a multiple
of 16 bytes (``16 / itemsize`` elements), the last chunk taking the rest, so that every chunk
starts 16-byte aligned and is read and written with 128-bit accesses; chunks differ in length
by less than 16 bytes' worth of elements plus one). Program ``pid`` owns blocks ``pid, pid + G,
...`` of every chunk:

    stage    own blocks of every chunk of x -> src_r (skipped with zero copy: src is x)
    barrier  group pid                       (all sources published)
    reduce   red_r[chunk r] = src_0[chunk r] + ... + src_{W-1}[chunk r]   (rank order)
    barrier  group G + pid                   (all reduced chunks published, all reads of src done)
    gather   out[chunk j] = red_j[chunk j]  for every j

Each chunk is reduced once, by its owner, so every rank gets the same bits (each element is
still ``src_0 (op) src_1 (op) ... src_{W-1}`` in rank order, whichever rank owns it).

Vector accesses (both kernels): full blocks are read and written unmasked, the partial last
block of a range masked (a mask ``offs < n`` with a runtime ``n`` is scalar); peer pointers
keep the 16-byte alignment of the symmetric pointer (``lang.peer_ptr``), so peer reads of
full blocks are 128-bit (``ld.global.v4.b32``), for every dtype. Writing ``out``
(which may be the caller's heap tensor that peers read) only after the second barrier makes
zero copy safe; ``red`` is rewritten only after the next call's first barrier.
"""

from __future__ import annotations

import triton
import triton.language as tl

from tilecomm.device import lang

from ..registry import ALL_DTYPES, REDUCE_OPS, check_int32, kernel
from .common import (COMMON_SIG, OP_AVG, OP_SUM, acc_f32, collective_jit, copy_blocks,
                     load_epoch, op_code, parity_half, reduce_blocks, signature)


@triton.jit
def chunk_start(c, n, WORLD: tl.constexpr, ALIGN: tl.constexpr, HINT: tl.constexpr = False):
    """Start of two_shot's chunk ``c`` of ``[0, n)`` (``c = WORLD``: ``n``): ``c * n // WORLD``
    rounded down to a multiple of ``ALIGN`` elements (16 bytes), so every chunk starts
    16-byte aligned and 128-bit accesses work on it; the last chunk takes the rest.

    ``HINT`` (only for ``c < WORLD``): tell the compiler the start is a multiple of ``ALIGN``.
    The hint is given here, on the value computed in this body: Triton 3.6 drops a
    ``tl.multiple_of`` put on the result of a call (3.9 keeps it), and every access of the
    chunk went scalar."""
    up = (c // WORLD) * (ALIGN - 1)                  # c == WORLD: round up, then clip to n
    start = tl.minimum((c * n // WORLD + up) // ALIGN * ALIGN, n)
    if HINT:
        start = tl.multiple_of(start, ALIGN)
    return start


@collective_jit
def one_shot_all_reduce_kernel(x, out, stage, half, pad, n, heap, epoch_ptr, WORLD: tl.constexpr,
                               BLOCK: tl.constexpr, OP: tl.constexpr, ACC_F32: tl.constexpr):
    """``stage``: both parity halves of the staging scratch, ``half`` elements apart."""
    epoch = load_epoch(epoch_ptr)
    stage = parity_half(stage, half, epoch)
    pid = tl.program_id(0)
    step = tl.num_programs(0) * BLOCK
    copy_blocks(stage, x, n, pid * BLOCK, step, BLOCK)
    if lang.barrier(pad, pid * WORLD, epoch, heap, WORLD, site=1):
        reduce_blocks(out, stage, n, pid * BLOCK, step, heap, WORLD, BLOCK, OP, ACC_F32)


@collective_jit
def two_shot_all_reduce_kernel(x, out, src, half, red, pad, n, heap, epoch_ptr,
                               WORLD: tl.constexpr, BLOCK: tl.constexpr, OP: tl.constexpr,
                               ACC_F32: tl.constexpr, STAGE: tl.constexpr):
    """Chunk ``c`` is ``[chunk_start(c), chunk_start(c + 1))``: boundaries ``c * n // W``
    rounded down to 16 bytes (``ALIGN`` elements), the last chunk takes the rest. ``src``:
    both parity halves of the staging scratch (``half`` elements apart), or ``x`` with
    ``half = 0`` (zero copy)."""
    rank = lang.my_rank(heap)
    ALIGN: tl.constexpr = 128 // x.dtype.element_ty.primitive_bitwidth
    epoch = load_epoch(epoch_ptr)
    src = parity_half(src, half, epoch)
    pid = tl.program_id(0)
    G = tl.num_programs(0)
    step = G * BLOCK
    if STAGE:
        for c in tl.static_range(WORLD):
            c0 = chunk_start(c, n, WORLD, ALIGN, True)
            clen = chunk_start(c + 1, n, WORLD, ALIGN) - c0
            copy_blocks(src + c0, x + c0, clen, pid * BLOCK, step, BLOCK)
    ok = lang.barrier(pad, pid * WORLD, epoch, heap, WORLD, site=1)
    if ok:
        r0 = chunk_start(rank, n, WORLD, ALIGN, True)
        rlen = chunk_start(rank + 1, n, WORLD, ALIGN) - r0
        reduce_blocks(red + r0, src + r0, rlen, pid * BLOCK, step, heap, WORLD, BLOCK, OP, ACC_F32)
        ok = lang.barrier(pad, (G + pid) * WORLD, epoch, heap, WORLD, site=2)
    if ok:
        for c in tl.static_range(WORLD):
            c0 = chunk_start(c, n, WORLD, ALIGN, True)
            clen = chunk_start(c + 1, n, WORLD, ALIGN) - c0
            copy_blocks(out + c0, lang.peer_ptr(red, c, heap) + c0, clen, pid * BLOCK, step, BLOCK)


@kernel("all_reduce", "one_shot", dtypes=ALL_DTYPES, ops=REDUCE_OPS)
def one_shot(ctx, call) -> None:
    x = call.buffers["buf"]
    n = x.numel()
    if n == 0:
        return
    check_int32("all_reduce", "one_shot", n)
    g = ctx.programs(n)
    pad = ctx.signals(g)
    stage, half = ctx.halves("all_reduce.one_shot", n, x.dtype)
    one_shot_all_reduce_kernel[(g,)](x, x, stage, half, pad, n, ctx.handle, ctx.epoch_dev,
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
    src, half = (x, 0) if ctx.zero_copy else ctx.halves("all_reduce.two_shot.src", n, x.dtype)
    red = ctx.scratch("all_reduce.two_shot.red", n, x.dtype)
    two_shot_all_reduce_kernel[(g,)](x, x, src, half, red, pad, n, ctx.handle, ctx.epoch_dev,
                                     WORLD=w, BLOCK=ctx.block, OP=op_code(call),
                                     ACC_F32=acc_f32(x.dtype), STAGE=not ctx.zero_copy)


def _compile_entries():
    """COMPILE entries: both kernels in every registered dtype (fp16/bf16 take the
    fp32-accumulating path), every op in fp32 and int32 (min/max/avg lower differently for
    integers), zero copy (STAGE=0) and an odd world size."""
    import torch

    def one(dt, world=8, op=OP_SUM, stage=1):
        sig1 = signature({"x": "*T", "out": "*T", "stage": "*T", "half": "i32", "n": "i32",
                          **COMMON_SIG}, dt)
        sig2 = signature({"x": "*T", "out": "*T", "src": "*T", "half": "i32", "red": "*T",
                          "n": "i32", **COMMON_SIG}, dt)
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
    out += one(torch.float64, op=OP_AVG)        # fp64 avg divides with div.rn.f64
    out += one(torch.float32, world=3, stage=0)
    return out


COMPILE = _compile_entries()

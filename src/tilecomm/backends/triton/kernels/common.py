"""Pieces shared by the collective kernels (imports triton)."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from tilecomm.device import lang

OP_SUM, OP_AVG, OP_MIN, OP_MAX, OP_PROD = 0, 1, 2, 3, 4
OP_CODE = {"sum": OP_SUM, "avg": OP_AVG, "min": OP_MIN, "max": OP_MAX, "prod": OP_PROD}

#: Triton signature names of the torch dtypes the kernels take
TL_NAME = {torch.float32: "fp32", torch.float16: "fp16", torch.bfloat16: "bf16",
           torch.float64: "fp64", torch.int32: "i32", torch.int64: "i64"}


#: Runtime integer arguments of the collective kernels, none of them specialized
#: (``triton.jit(do_not_specialize=...)``). Triton otherwise turns an integer argument equal
#: to 1 into a constant and tags one divisible by 16, so epochs (1, 16, 32, ...), sizes,
#: roots and parities would each compile another variant mid-run. The rank and the wait bound
#: are no arguments: kernels read them from the device handle (tilecomm.device.handle), so
#: every rank runs the same binary. Sizes need no divisibility for vector accesses: the
#: kernels copy full blocks unmasked and alignment comes from the pointers (Triton's 16-byte
#: pointer specialization, heap-base hints in ``lang.peer_ptr``, ``tl.multiple_of`` on
#: offsets). Names a kernel lacks are ignored. The
#: epoch is not among them: kernels load it from ``epoch_ptr`` (NOTE [device epochs] in
#: context.py), a pointer; ``half``/``src_half``/``tmp_half`` are parity-half sizes.
RUNTIME_INTS = ("n", "m", "cap", "half", "src_half", "tmp_half", "root", "arrive_group",
                "nphases", "nin", "nout")


def collective_jit(fn):
    """``triton.jit`` for collective kernels: no specialization of :data:`RUNTIME_INTS`."""
    return triton.jit(fn, do_not_specialize=RUNTIME_INTS)


def op_code(call) -> int:
    return OP_SUM if call.op is None else OP_CODE[call.op.value]


def acc_f32(dtype: torch.dtype) -> int:
    """1: accumulate in fp32 (fp16, bf16); 0: in the dtype itself."""
    return int(dtype in (torch.float16, torch.bfloat16))


@triton.jit
def load_epoch(epoch_ptr):
    """This call's epoch (NOTE [device epochs] in context.py): every program loads it, no
    program writes it (the stream increments it before the kernel)."""
    return tl.load(epoch_ptr)


@triton.jit
def parity_half(base, half, epoch):
    """``base + (epoch % 2) * half``: the parity half of a two-half scratch buffer chosen on
    the device. ``half`` is a multiple of 256 bytes (``KernelContext.halves``), so the
    16-byte alignment of ``base`` carries over (hinted: 128-bit accesses stay)."""
    A: tl.constexpr = 128 // base.dtype.element_ty.primitive_bitwidth
    off = tl.multiple_of((epoch % 2) * tl.cast(half, tl.int64), A)
    return base + off


@triton.jit
def load_acc(ptr, mask, ACC_F32: tl.constexpr, FULL: tl.constexpr = False):
    """Load a block, widened to fp32 when ACC_F32. ``FULL``: the whole block is in range, load
    it unmasked (``mask`` unused), which lets Triton vectorize it whatever the size."""
    if FULL:
        v = tl.load(ptr)
    else:
        v = tl.load(ptr, mask=mask, other=0)
    if ACC_F32:
        v = v.to(tl.float32)
    return v


@triton.jit
def store_block(ptr, value, mask, FULL: tl.constexpr = False):
    """``tl.store``, unmasked when ``FULL`` (the whole block is in range)."""
    if FULL:
        tl.store(ptr, value)
    else:
        tl.store(ptr, value, mask=mask)


@triton.jit
def copy_block(dst, src, offs, n, FULL: tl.constexpr):
    """``dst[offs] = src[offs]`` where ``offs < n`` (all of the block when ``FULL``)."""
    if FULL:
        tl.store(dst + offs, tl.load(src + offs))
    else:
        m = offs < n
        tl.store(dst + offs, tl.load(src + offs, mask=m), mask=m)


@triton.jit
def copy_blocks(dst, src, n, first, step, BLOCK: tl.constexpr):
    """``dst[i] = src[i]`` for ``i < n``, blocks ``first, first + step, ...`` (``first`` and
    ``step`` multiples of ``BLOCK``). Full blocks are copied unmasked: a mask ``offs < n``
    with a runtime ``n`` keeps Triton from vectorizing (its alignment is unknown), so only the
    last, partial block takes the masked, scalar path."""
    for start in range(first, n, step):
        offs = start + tl.arange(0, BLOCK)
        if start + BLOCK <= n:
            copy_block(dst, src, offs, n, True)
        else:
            copy_block(dst, src, offs, n, False)


@triton.jit
def combine(acc, v, OP: tl.constexpr):
    """``acc (op) v``; avg sums (finish divides)."""
    if OP == 2:
        r = tl.minimum(acc, v, propagate_nan=tl.PropagateNan.ALL)
    elif OP == 3:
        r = tl.maximum(acc, v, propagate_nan=tl.PropagateNan.ALL)
    elif OP == 4:
        r = acc * v
    else:
        r = acc + v
    return r


@triton.jit
def finish(acc, OP: tl.constexpr, WORLD: tl.constexpr):
    """Apply avg's division by the world size, correctly rounded (``div_rn``: Triton's ``/``
    on fp32 compiles to ``div.approx.f32`` on sm_90, which would not give the executor's and
    the reference's IEEE quotient). fp64 divides with ``/``: PTX's ``div.rn.f64`` is already
    correctly rounded, and Triton before 3.9 takes only fp32 in ``div_rn`` (the H200 run on
    Triton 3.6 failed to compile float64 avg)."""
    if OP == 1:
        if not acc.dtype.is_floating():     # (the Communicator refuses integer avg)
            acc = acc.to(tl.float32)
        if acc.dtype.is_fp64():
            acc = acc / WORLD
        else:
            acc = tl.div_rn(acc, tl.full(acc.shape, WORLD, acc.dtype))
    return acc


@triton.jit
def copy_blocks64(dst, src, n, pid, nprog, BLOCK: tl.constexpr):
    """:func:`copy_blocks` with int64 offsets: blocks ``pid, pid + nprog, ...`` of ``[0, n)``
    (``n`` may exceed 2^31); full blocks unmasked, the partial last one masked."""
    ar = tl.arange(0, BLOCK)
    nblk = tl.cdiv(n, BLOCK).to(tl.int32)
    for b in range(pid, nblk, nprog):
        start = tl.cast(b, tl.int64) * BLOCK
        offs = start + ar
        if start + BLOCK <= n:
            copy_block(dst, src, offs, n, True)
        else:
            copy_block(dst, src, offs, n, False)


@triton.jit
def reduce_block(out, src, offs, m, heap, WORLD: tl.constexpr, OP: tl.constexpr,
                 ACC_F32: tl.constexpr, FULL: tl.constexpr):
    """``out[offs] = src_0[offs] (op) src_1[offs] (op) ...`` in rank order, ``src`` a
    symmetric pointer (the peers' copies are read), fp32 accumulation when ``ACC_F32``."""
    acc = load_acc(lang.peer_ptr(src, 0, heap) + offs, m, ACC_F32, FULL)
    for q in tl.static_range(1, WORLD):
        v = load_acc(lang.peer_ptr(src, q, heap) + offs, m, ACC_F32, FULL)
        acc = combine(acc, v, OP)
    acc = finish(acc, OP, WORLD)
    store_block(out + offs, acc.to(out.dtype.element_ty), m, FULL)


@triton.jit
def reduce_blocks(out, src, n, first, step, heap, WORLD: tl.constexpr, BLOCK: tl.constexpr,
                  OP: tl.constexpr, ACC_F32: tl.constexpr):
    """:func:`reduce_block` over blocks ``first, first + step, ...`` of ``[0, n)``: full
    blocks unmasked (vectorized), the partial last one masked."""
    for start in range(first, n, step):
        offs = start + tl.arange(0, BLOCK)
        if start + BLOCK <= n:
            reduce_block(out, src, offs, offs < n, heap, WORLD, OP, ACC_F32, True)
        else:
            reduce_block(out, src, offs, offs < n, heap, WORLD, OP, ACC_F32, False)


def signature(names_types: dict, dtype: torch.dtype, acc_dtype: torch.dtype | None = None) -> dict:
    """A compile signature: ``"T"`` stands for the data dtype, ``"A"`` for the accumulator's."""
    t = TL_NAME[dtype]
    a = TL_NAME[acc_dtype or dtype]
    return {k: v.replace("*T", "*" + t).replace("*A", "*" + a) for k, v in names_types.items()}


COMMON_SIG = {"pad": "*i64", "heap": "*i64", "epoch_ptr": "*i64"}

"""Triton kernels of MoE dispatch/combine (:mod:`tilecomm.moe.kernel`; normal mode here, the
low-latency kernels ``moe_ll_*`` below).

Written on the device API (:mod:`tilecomm.device.lang`); importing this module imports triton.
The host (``tilecomm.moe.kernel.KernelEngine``) runs the handshake first, so every rank knows
the whole matrix ``counts[s][r]`` (rows source ``s`` sends to rank ``r``) and lays out the
symmetric receive buffers the same way.

``moe_dispatch_push``, grid ``(P, W)``; program ``(pid, j)`` serves destination
``dst = rank + j`` (mod W) and hears from ``src = rank - j``:

    put      rows pid, pid + P, ... of the tokens ``tok[first : first + n]`` chosen for dst:
             the x row (words) to dst's ``recv_x`` row ``doff + i``, the token's metadata row
             (int32 words: token index, topk_idx, topk_weights, fp8 scales) to ``recv_meta``
    signal   dst's slot ``pid * W + rank`` = epoch                   (release, sys)
    wait     own slot ``pid * W + src`` >= epoch                     (acquire, sys, bounded)

``moe_combine_push``: the same grid and signals; program ``(pid, j)`` copies blocks ``pid,
pid + P, ...`` of the contiguous rows ``y[lo : lo + n]`` this rank holds for source ``dst``'s
tokens into dst's ``recv`` at row ``off`` (dst's rows are ordered by destination rank).

``moe_combine_sum`` (local, after the push): ``out[t] = round(sum over r in rank order of
recv[pos[r, t]])`` in float32, skipping ``pos = -1``; one rounding to the output dtype.

Slots: ``pid * W + p`` is only ever written by rank ``p``; a program only waits for the
program of the same id on a peer, which signals before it waits, so the interpreter (programs
one after another) cannot deadlock. Every program signals and waits, also with nothing to
send: a call completes on a rank only once every peer has pushed everything for it. The
``j == 0`` programs copy to this rank itself and need no signal (the host reads after the
kernel).
"""

from __future__ import annotations

import triton
import triton.language as tl

from tilecomm.device import lang

from .common import copy_blocks, copy_blocks64

SITE_DISPATCH = tl.constexpr(1)
SITE_COMBINE = tl.constexpr(2)

#: runtime integers never specialized (an epoch of 1 or 16 would otherwise compile new
#: variants mid-run; see common.RUNTIME_INTS)
_INTS = ("epoch", "row_words", "meta_words", "tokens", "hidden")


@triton.jit
def _peers_and_plan(plan, rank, WORLD: tl.constexpr):
    """Program ``(pid, j)``'s peers, ``dst = rank + j`` and ``src = rank - j`` (mod W), and
    the three entries ``plan [3, W]`` holds for ``dst``: ``(j, dst, src, p0, p1, p2)``."""
    j = tl.program_id(1)
    dst = (rank + j) % WORLD
    src = (rank + WORLD - j) % WORLD
    return (j, dst, src, tl.load(plan + dst), tl.load(plan + WORLD + dst),
            tl.load(plan + 2 * WORLD + dst))


@triton.jit
def _row_stride(row_words, WV: tl.constexpr, ALIGNED: tl.constexpr):
    """``row_words`` as int64, declared a multiple of ``WV`` (16 bytes of words) when
    ``ALIGNED``, so row copies use 128-bit accesses."""
    rw = tl.cast(row_words, tl.int64)
    if ALIGNED:
        rw = tl.multiple_of(rw, WV)
    return rw


@triton.jit
def _signal_and_wait(pad, pid, j, dst, src, epoch, rank, heap, WORLD: tl.constexpr,
                     SITE: tl.constexpr):
    """After a program's pushes: tell ``dst`` (release), then wait (bounded) for ``src``'s
    program of the same id. ``j == 0`` pushed to this rank itself: nothing to tell."""
    if j != 0:
        lang.signal_set(pad, pid * WORLD + rank, epoch, dst, heap)
        lang.wait_ge(pad, pid * WORLD + src, epoch, src, heap, SITE)


@triton.jit(do_not_specialize=_INTS)
def moe_dispatch_push(x, meta, tok, plan, recv_x, recv_meta, pad, heap, epoch, row_words,
                      meta_words, WORLD: tl.constexpr, BX: tl.constexpr, BM: tl.constexpr,
                      ALIGNED: tl.constexpr):
    """``x [T, row_words]`` words, ``meta [T, meta_words]`` int32 (meta_words a multiple of 4),
    ``tok`` int64 (this rank's chosen tokens, destination by destination, increasing),
    ``plan`` int64 ``[3, W]``: per destination the first entry of ``tok``, the count and the
    first row at the destination. ``recv_x`` / ``recv_meta``: symmetric (this call's half).
    ``ALIGNED``: ``row_words`` is a multiple of 16 bytes of words and every pointer is
    16-byte aligned (128-bit row copies)."""
    rank = lang.my_rank(heap)
    pid = tl.program_id(0)
    nprog = tl.num_programs(0)
    j, dst, src, first, n, doff = _peers_and_plan(plan, rank, WORLD)
    rw = _row_stride(row_words, 128 // x.dtype.element_ty.primitive_bitwidth, ALIGNED)
    mw = tl.multiple_of(tl.cast(meta_words, tl.int64), 4)
    rx = lang.peer_ptr(recv_x, dst, heap)
    rm = lang.peer_ptr(recv_meta, dst, heap)
    for i in range(pid, n, nprog):
        t = tl.load(tok + first + i)
        row = doff + i
        copy_blocks(rx + row * rw, x + t * rw, rw, 0, BX, BX)       # one row, block by block
        copy_blocks(rm + row * mw, meta + t * mw, mw, 0, BM, BM)
    _signal_and_wait(pad, pid, j, dst, src, epoch, rank, heap, WORLD, SITE_DISPATCH)


@triton.jit(do_not_specialize=_INTS)
def moe_combine_push(y, plan, recv, pad, heap, epoch, row_words, WORLD: tl.constexpr,
                     BLOCK: tl.constexpr, ALIGNED: tl.constexpr):
    """``y [R, row_words]`` words (this rank's rows, by source rank then token); ``plan``
    int64 ``[3, W]``: per source rank the first row of its rows in ``y``, their count and the
    first row they take in that rank's ``recv`` (symmetric, this call's half)."""
    rank = lang.my_rank(heap)
    pid = tl.program_id(0)
    nprog = tl.num_programs(0)
    j, dst, src, lo, n, off = _peers_and_plan(plan, rank, WORLD)
    rw = _row_stride(row_words, 128 // y.dtype.element_ty.primitive_bitwidth, ALIGNED)
    d = lang.peer_ptr(recv, dst, heap) + off * rw
    copy_blocks64(d, y + lo * rw, n * rw, pid, nprog, BLOCK)
    _signal_and_wait(pad, pid, j, dst, src, epoch, rank, heap, WORLD, SITE_COMBINE)


@triton.jit(do_not_specialize=_INTS)
def moe_combine_sum(recv, pos, out, tokens, hidden, WORLD: tl.constexpr, BT: tl.constexpr,
                    BH: tl.constexpr):
    """``out [T, H]`` <- per token the float32 sum, destination rank by destination rank, of
    ``recv[pos[r, t]]`` (``pos [W, T]`` int32, -1: rank r holds no row of token t), rounded
    once. A token without rows is +0. Grid ``(cdiv(T, BT), cdiv(H, BH))``."""
    rows = tl.program_id(0) * BT + tl.arange(0, BT)
    cols = tl.program_id(1) * BH + tl.arange(0, BH)
    rm = rows < tokens
    cm = cols < hidden
    h64 = tl.cast(hidden, tl.int64)
    acc = tl.zeros((BT, BH), dtype=tl.float32)
    for r in tl.static_range(WORLD):
        p = tl.load(pos + r * tokens + rows, mask=rm, other=-1)
        has = p >= 0
        m = has[:, None] & cm[None, :]
        v = tl.load(recv + tl.cast(p, tl.int64)[:, None] * h64 + cols[None, :], mask=m,
                    other=0.0).to(tl.float32)
        acc = tl.where(has[:, None], acc + v, acc)   # no +0 for a missing row (-0 stays)
    tl.store(out + tl.cast(rows, tl.int64)[:, None] * h64 + cols[None, :],
             acc.to(out.dtype.element_ty), mask=rm[:, None] & cm[None, :])


# ---- low-latency mode (no host round trip per call) -----------------------------------------
# Fixed buffers per (M, K, fp8), agreed once; a per-call epoch the host bumps *on the device*
# (``epoch.add_(1)`` before the launch, read by the kernel), so a captured CUDA graph replays
# with fresh epochs. Receive layouts, on every rank:
#   recv_x    [El, W, M, row_words]   source s's rows for local expert le at [le, s, 0:n]
#   recv_meta [El, W, M, meta_words]  int32 words per slot: token index (int64), fp8 scales
#   recv_cnt  [El + 2, W] int64       n, then the source's (fp8, K), written before its signal
#   comb      [E, M, row_words]       (combine, on the source) expert e's output of the
#                                     token at position p of (this rank -> e) at [e, p]

SITE_LL_DISPATCH = tl.constexpr(3)
SITE_LL_COMBINE = tl.constexpr(4)


@triton.jit
def _ll_peers(epoch_ptr, rank, WORLD: tl.constexpr):
    """Program ``(pid, j)`` of a low-latency kernel: ``(pid, P, j, dst, src, epoch)``, its
    peers as in :func:`_peers_and_plan` and this call's epoch, read from the device."""
    j = tl.program_id(1)
    return (tl.program_id(0), tl.num_programs(0), j, (rank + j) % WORLD,
            (rank + WORLD - j) % WORLD, tl.load(epoch_ptr))


@triton.jit(do_not_specialize=_INTS + ("pairs", "el", "m"))
def moe_ll_dispatch_push(x, meta, idx, pos, cnt, desc, recv_x, recv_meta, recv_cnt, pad, epoch_ptr,
                         heap, pairs, topk, el, m, row_words, meta_words, WORLD: tl.constexpr,
                         BX: tl.constexpr, BM: tl.constexpr, ALIGNED: tl.constexpr):
    """Grid ``(P, W)``; program ``(pid, j)`` serves ``dst = rank + j``: for the (token, k)
    pairs ``pid, pid + P, ...`` of ``idx [T*K]`` (int64 experts, -1 or out of range: none)
    whose expert lives on ``dst``, the token's x row and meta row go to dst's slot
    ``[le, rank, pos]`` (``pos [T*K]``: the pair's position among this rank's tokens for that
    expert, computed on the device); program 0 writes ``cnt [E]`` (this rank's tokens per
    expert) for dst's experts and ``desc [2]`` (this call's fp8, K) into dst's
    ``recv_cnt[:, rank]``. Then signal dst and wait for ``src = rank - j`` (bounded), as the
    normal-mode kernels do."""
    rank = lang.my_rank(heap)
    pid, nprog, j, dst, src, epoch = _ll_peers(epoch_ptr, rank, WORLD)
    rw = _row_stride(row_words, 128 // x.dtype.element_ty.primitive_bitwidth, ALIGNED)
    mw = tl.multiple_of(tl.cast(meta_words, tl.int64), 4)
    m64 = tl.cast(m, tl.int64)
    rx = lang.peer_ptr(recv_x, dst, heap)
    rm = lang.peer_ptr(recv_meta, dst, heap)
    lo = tl.cast(dst, tl.int64) * el
    for i in range(pid, pairs, nprog):
        e = tl.load(idx + i)
        p = tl.load(pos + i)
        if (e >= lo) & (e < lo + el) & (p < m64):      # never outside the slots
            t = i // topk
            row = ((e - lo) * WORLD + rank) * m64 + p
            copy_blocks(rx + row * rw, x + t * rw, rw, 0, BX, BX)
            copy_blocks(rm + row * mw, meta + t * mw, mw, 0, BM, BM)
    if pid == 0:
        rc = lang.peer_ptr(recv_cnt, dst, heap)
        for le in range(0, el):
            tl.store(rc + le * WORLD + rank, tl.load(cnt + lo + le))
        for i in range(0, 2):
            tl.store(rc + (el + i) * WORLD + rank, tl.load(desc + i))
    _signal_and_wait(pad, pid, j, dst, src, epoch, rank, heap, WORLD, SITE_LL_DISPATCH)


@triton.jit(do_not_specialize=_INTS + ("el", "m"))
def moe_ll_combine_push(y, recv_cnt, comb, pad, epoch_ptr, heap, el, m, row_words,
                        WORLD: tl.constexpr, BLOCK: tl.constexpr, ALIGNED: tl.constexpr):
    """Grid ``(P, W)``; program ``(pid, j)`` returns to ``dst = rank + j`` the outputs of the
    rows dst sent: for each local expert ``le``, the ``n = recv_cnt[le, dst]`` rows
    ``y[le, dst, 0:n]`` (``y [El, W, M, row_words]``) go to dst's ``comb[rank*El + le, 0:n]``
    (blocks ``pid, pid + P, ...`` of each); then signal and wait as above."""
    rank = lang.my_rank(heap)
    pid, nprog, j, dst, src, epoch = _ll_peers(epoch_ptr, rank, WORLD)
    rw = _row_stride(row_words, 128 // y.dtype.element_ty.primitive_bitwidth, ALIGNED)
    m64 = tl.cast(m, tl.int64)
    d = lang.peer_ptr(comb, dst, heap)
    for le in range(0, el):
        n = tl.load(recv_cnt + le * WORLD + dst)
        first = (tl.cast(rank, tl.int64) * el + le) * m64
        copy_blocks64(d + first * rw, y + ((le * WORLD + dst) * m64) * rw, n * rw, pid, nprog,
                      BLOCK)
    _signal_and_wait(pad, pid, j, dst, src, epoch, rank, heap, WORLD, SITE_LL_COMBINE)


#: programs per destination and block sizes on a GPU (not tuned: nothing has run on a GPU);
#: the interpreter uses one program per destination (its programs run one after another)
GPU_PROGRAMS = 8
BLOCK_GPU = 1024
SUM_BLOCKS_GPU = (4, 1024)


def _dispatch_sig(word: str) -> dict:
    return {"x": f"*{word}", "meta": "*i32", "tok": "*i64", "plan": "*i64",
            "recv_x": f"*{word}", "recv_meta": "*i32", "pad": "*i64", "heap": "*i64",
            "epoch": "i64", "row_words": "i32", "meta_words": "i32"}


def _compile_entries():
    out = []
    for word in ("i64", "i32", "i16", "u8"):
        for aligned in (0, 1):
            out.append((moe_dispatch_push, _dispatch_sig(word),
                        {"WORLD": 8, "BX": BLOCK_GPU, "BM": 64, "ALIGNED": aligned}))
            out.append((moe_combine_push,
                        {"y": f"*{word}", "plan": "*i64", "recv": f"*{word}", "pad": "*i64",
                         "heap": "*i64", "epoch": "i64", "row_words": "i32"},
                        {"WORLD": 8, "BLOCK": BLOCK_GPU, "ALIGNED": aligned}))
        out.append((moe_ll_dispatch_push,
                    {"x": f"*{word}", "meta": "*i32", "idx": "*i64", "pos": "*i64",
                     "cnt": "*i64", "desc": "*i64", "recv_x": f"*{word}", "recv_meta": "*i32",
                     "recv_cnt": "*i64", "pad": "*i64", "epoch_ptr": "*i64", "heap": "*i64",
                     "pairs": "i32", "topk": "i32", "el": "i32", "m": "i32",
                     "row_words": "i32", "meta_words": "i32"},
                    {"WORLD": 8, "BX": BLOCK_GPU, "BM": 64, "ALIGNED": 1}))
        out.append((moe_ll_combine_push,
                    {"y": f"*{word}", "recv_cnt": "*i64", "comb": f"*{word}", "pad": "*i64",
                     "epoch_ptr": "*i64", "heap": "*i64", "el": "i32", "m": "i32",
                     "row_words": "i32"},
                    {"WORLD": 8, "BLOCK": BLOCK_GPU, "ALIGNED": 1}))
    bt, bh = SUM_BLOCKS_GPU
    for dt in ("bf16", "fp16", "fp32"):
        out.append((moe_combine_sum, {"recv": f"*{dt}", "pos": "*i32", "out": f"*{dt}",
                                      "tokens": "i32", "hidden": "i32"},
                    {"WORLD": 8, "BT": bt, "BH": bh}))
    return out


#: kernels for the sm_90 compile check (tilecomm.device.compile_check)
COMPILE = _compile_entries()

"""Persistent Triton GEMMs fused with an all-gather (A rows) or a reduce-scatter (C rows).

Used by :mod:`tilecomm.ops.kernel`; written on the device API (:mod:`tilecomm.device.lang`).
Importing this module imports triton.

``all_gather_matmul_kernel`` (``g [W*m, K]`` symmetric, this rank's chunk already written
by the host; ``b [K, N]`` any strides; ``c [W*m, N]``)
    Program 0 first signals every peer that this rank's chunk is ready (slot ``rank`` of the
    peer's pad, release). The work is a list of tasks ``(row block, column block)`` ordered
    chunk by chunk starting from the rank's own chunk and rotating (``rank, rank+1, ...``), so
    that at any time the ranks read different peers; task ``t`` belongs to program
    ``t % P``. The first program (lowest id) that has a task of a peer's row block copies it:
    it waits for the owner's ready signal (acquire), copies the ``BM x K`` rows from the
    owner's ``g`` into its own (``lang.get``) and sets a local ready signal of that row block
    (release); tasks of that row block on other programs wait for it. Waits only ever point
    at lower program ids (or peers), which is what the interpreter (programs one by one) and a
    GPU (all programs resident) both allow. Every tile accumulates in float32 (``tl.dot``,
    ``ieee`` for float32 inputs, as torch.matmul without TF32) and is rounded once.

``matmul_reduce_scatter_kernel`` (``a [W*m, K_r]``, ``b [K_r, N]`` any strides; ``part [W,
m, N]`` symmetric, the inputs' dtype; ``out [m, N]``)
    Program ``p`` computes output tiles ``u = p, p+P, ...`` of every owner, the next rank
    first and its own rows last; a peer's tile, rounded to the inputs' dtype (the
    reference's partial, :mod:`tilecomm.ops.reference`), is stored straight into slot
    ``rank`` of the owner's ``part`` (remote stores) and announced by setting the owner's
    signal ``(tile, rank)`` to the epoch (release). Then, for its own tiles, it waits for
    every peer's signal of the tile (acquire) and adds ``part[0] + part[1] + ...`` in rank
    order in float32, rounding once into ``out`` (the reference's order).

Reuse: ``g`` and ``part`` have two halves chosen by the epoch's parity. A rank that starts call
``k + 2`` has finished call ``k + 1``, in which it waited for a signal every peer sent in its
own call ``k + 1``, issued after that peer finished call ``k`` (stream order): nobody still
reads or reduces the half of call ``k``. Signals are *set* to the epoch, one slot per
sender: a count of arrivals could be completed by a fast peer's next call standing in for a
slow peer's current one.
"""

from __future__ import annotations

import triton
import triton.language as tl

from ....device import lang

# pad layout of all_gather_matmul: [0, W) chunk ready (set by peers), [W, W + rowblocks) row
# block copied (set by this rank's programs)
SITE_CHUNK = tl.constexpr(1)
SITE_ROWS = tl.constexpr(2)
SITE_TILE = tl.constexpr(3)


@triton.jit
def _tile(a_ptr, sa_m, sa_k, rows, rmask, b_ptr, sb_k, sb_n, cols, cmask, k,
          BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, PRECISION: tl.constexpr,
          UPCAST: tl.constexpr = lang.INTERPRETED):
    """float32 ``a[rows, :] @ b[:, cols]`` (a ``BM x BN`` block)."""
    acc = tl.zeros((BM, BN), dtype=tl.float32)
    kk = tl.arange(0, BK)
    for k0 in range(0, k, BK):
        km = (k0 + kk) < k
        x = tl.load(a_ptr + rows[:, None] * sa_m + (k0 + kk)[None, :] * sa_k,
                    mask=rmask[:, None] & km[None, :], other=0.0)
        y = tl.load(b_ptr + (k0 + kk)[:, None] * sb_k + cols[None, :] * sb_n,
                    mask=km[:, None] & cmask[None, :], other=0.0)
        if UPCAST:     # the interpreter's tl.dot mishandles 16-bit floats (numpy has no bf16)
            x = x.to(tl.float32)
            y = y.to(tl.float32)
        acc = tl.dot(x, y, acc, input_precision=PRECISION)
    return acc


@triton.jit
def all_gather_matmul_kernel(g, b, c, pad, heap, epoch, m, n, k, sb_k, sb_n, WORLD: tl.constexpr,
                             BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr,
                             PRECISION: tl.constexpr):
    rank = lang.my_rank(heap)
    pid = tl.program_id(0)
    progs = tl.num_programs(0)
    if pid == 0:                          # this rank's chunk of g is ready (host copy before)
        for p in tl.static_range(WORLD):
            if p != rank:
                lang.signal_set(pad, rank, epoch, p, heap)
    rb_per = tl.cdiv(m, BM)
    nb = tl.cdiv(n, BN)
    tasks = WORLD * rb_per * nb
    kk = tl.arange(0, BK)
    for t in range(pid, tasks, progs):
        x = t // nb                       # row block, in rotation order
        cb = t % nb
        step = x // rb_per
        src = (rank + step) % WORLD
        local_rows = (x % rb_per) * BM + tl.arange(0, BM)
        rmask = local_rows < m
        rows = src * m + local_rows       # rows of g / c
        if src != rank:
            first = x * nb                # the row block's first task
            s = first % progs
            # lowest program with a task of this row block, and that task's column block
            copier = tl.where(s + nb > progs, 0, s)
            copy_cb = tl.where(s + nb > progs, (progs - s) % progs, 0)
            if (pid == copier) & (cb == copy_cb):
                ok = lang.wait_ge(pad, src, epoch, src, heap, SITE_CHUNK)
                if ok:
                    for k0 in range(0, k, BK):
                        offs = rows[:, None] * k + (k0 + kk)[None, :]
                        lang.get(g, g, offs, rmask[:, None] & ((k0 + kk) < k)[None, :], src, heap)
                lang.signal_set(pad, WORLD + x, epoch, rank, heap)
            elif pid != copier:
                lang.wait_ge(pad, WORLD + x, epoch, rank, heap, SITE_ROWS)
            tl.debug_barrier()           # every thread's loads below follow the copy
        cols = cb * BN + tl.arange(0, BN)
        cmask = cols < n
        acc = _tile(g, k, 1, rows, rmask, b, sb_k, sb_n, cols, cmask, k, BM, BN, BK, PRECISION)
        tl.store(c + rows[:, None] * n + cols[None, :], acc.to(c.dtype.element_ty),
                 mask=rmask[:, None] & cmask[None, :])


@triton.jit
def matmul_reduce_scatter_kernel(a, b, part, out, pad, heap, epoch, m, n, k, sa_m, sa_k, sb_k,
                                 sb_n, WORLD: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr,
                                 BK: tl.constexpr, PRECISION: tl.constexpr):
    rank = lang.my_rank(heap)
    pid = tl.program_id(0)
    progs = tl.num_programs(0)
    nb = tl.cdiv(n, BN)
    tiles = tl.cdiv(m, BM) * nb
    mn = m * n
    for j in range(1, WORLD + 1):      # a loop, not unrolled: one copy of the GEMM code
        dst = (rank + j) % WORLD          # the next rank first, this rank's own rows last
        for u in range(pid, tiles, progs):
            lrows = (u // nb) * BM + tl.arange(0, BM)
            cols = (u % nb) * BN + tl.arange(0, BN)
            rmask = lrows < m
            cmask = cols < n
            acc = _tile(a, sa_m, sa_k, dst * m + lrows, rmask, b, sb_k, sb_n, cols, cmask, k,
                        BM, BN, BK, PRECISION)
            slot = lang.peer_ptr(part, dst, heap) + rank * mn
            tl.store(slot + lrows[:, None] * n + cols[None, :], acc.to(part.dtype.element_ty),
                     mask=rmask[:, None] & cmask[None, :])
            if dst != rank:
                lang.signal_set(pad, u * WORLD + rank, epoch, dst, heap)
    tl.debug_barrier()                   # the own partials are stored before they are read
    for u in range(pid, tiles, progs):
        lrows = (u // nb) * BM + tl.arange(0, BM)
        cols = (u % nb) * BN + tl.arange(0, BN)
        mask = (lrows < m)[:, None] & (cols < n)[None, :]
        offs = lrows[:, None] * n + cols[None, :]
        for s in tl.static_range(WORLD):
            if s != rank:
                lang.wait_ge(pad, u * WORLD + s, epoch, s, heap, SITE_TILE)
        acc = tl.load(part + offs, mask=mask, other=0.0).to(tl.float32)
        for s in tl.static_range(1, WORLD):
            acc += tl.load(part + s * mn + offs, mask=mask, other=0.0).to(tl.float32)
        tl.store(out + offs, acc.to(out.dtype.element_ty), mask=mask)


# ---- the copy-engine variant of all_gather_matmul (ops.kernel, copy="stream") -------------
# The host queues, per peer chunk in rotation order, on a side stream: wait_chunk_kernel (the
# owner's ready signal, acquire), a cudaMemcpyAsync of the chunk from the owner's g into this
# rank's g (the copy engine), an event; on the main stream: chunk_ready_kernel (after the own
# chunk's host copy), the own chunk's chunk_matmul_kernel, then per peer chunk a wait for its
# event and its chunk_matmul_kernel. No kernel spins on work of another stream of this rank
# (only on peers' signals), so it cannot deadlock on SMs held by the GEMM.


@triton.jit
def chunk_ready_kernel(pad, heap, epoch, WORLD: tl.constexpr):
    """Tell every peer that this rank's chunk of ``g`` is written (slot ``rank`` of the peer's
    pad := epoch, release); the same signal all_gather_matmul_kernel's program 0 sends."""
    rank = lang.my_rank(heap)
    for p in tl.static_range(WORLD):
        if p != rank:
            lang.signal_set(pad, rank, epoch, p, heap)


@triton.jit
def wait_chunk_kernel(pad, src, epoch, heap):
    """Wait (bounded, acquire) for rank ``src``'s ready signal of this epoch; a timeout is
    recorded in the handle (DeviceHeap.check raises it) and the copy after it is garbage."""
    lang.wait_ge(pad, src, epoch, src, heap, SITE_CHUNK)


@triton.jit
def chunk_matmul_kernel(g, b, c, row0, m, n, k, sb_k, sb_n, BM: tl.constexpr,
                        BN: tl.constexpr, BK: tl.constexpr, PRECISION: tl.constexpr):
    """``c[row0:row0+m] = g[row0:row0+m] @ b`` (``g [*, K]`` contiguous, float32 accumulation,
    one rounding): one tile per program, grid ``cdiv(m, BM) * cdiv(n, BN)``."""
    t = tl.program_id(0)
    nb = tl.cdiv(n, BN)
    local_rows = (t // nb) * BM + tl.arange(0, BM)
    rmask = local_rows < m
    rows = row0 + local_rows
    cols = (t % nb) * BN + tl.arange(0, BN)
    cmask = cols < n
    acc = _tile(g, k, 1, rows, rmask, b, sb_k, sb_n, cols, cmask, k, BM, BN, BK, PRECISION)
    tl.store(c + rows[:, None] * n + cols[None, :], acc.to(c.dtype.element_ty),
             mask=rmask[:, None] & cmask[None, :])


#: tile shapes (BM, BN, BK): the interpreter runs every op in numpy (small blocks keep the
#: tests fast); on a GPU a common Hopper choice for 16-bit inputs, and smaller tiles for
#: float32, which has no tensor-core path without TF32 (not tuned: nothing has run on a GPU)
INTERP_BLOCKS = (16, 32, 32)
GPU_BLOCKS = {"bf16": (128, 128, 64), "fp16": (128, 128, 64), "fp32": (64, 64, 32)}


def _sig(ag: bool, dt: str) -> dict:
    if ag:
        names = ["g", "b", "c", "pad", "heap", "epoch", "m", "n", "k", "sb_k", "sb_n"]
        types = [f"*{dt}", f"*{dt}", f"*{dt}", "*i64", "*i64", "i64",
                 "i32", "i32", "i32", "i32", "i32"]
    else:
        names = ["a", "b", "part", "out", "pad", "heap", "epoch",
                 "m", "n", "k", "sa_m", "sa_k", "sb_k", "sb_n"]
        types = [f"*{dt}", f"*{dt}", f"*{dt}", f"*{dt}", "*i64", "*i64", "i64",
                 "i32", "i32", "i32", "i32", "i32", "i32", "i32"]
    return dict(zip(names, types))


def _compile_entries():
    out = []
    for dt, prec in (("bf16", "tf32"), ("fp16", "tf32"), ("fp32", "ieee")):
        bm, bn, bk = GPU_BLOCKS[dt]
        consts = {"WORLD": 8, "BM": bm, "BN": bn, "BK": bk, "PRECISION": prec}
        out.append((all_gather_matmul_kernel, _sig(True, dt), consts))
        out.append((matmul_reduce_scatter_kernel, _sig(False, dt), consts))
        chunk = dict(zip(["g", "b", "c", "row0", "m", "n", "k", "sb_k", "sb_n"],
                         [f"*{dt}"] * 3 + ["i32"] * 6))
        out.append((chunk_matmul_kernel, chunk,
                    {k: v for k, v in consts.items() if k != "WORLD"}))
    out.append((chunk_ready_kernel, {"pad": "*i64", "heap": "*i64", "epoch": "i64"},
                {"WORLD": 8}))
    out.append((wait_chunk_kernel, {"pad": "*i64", "src": "i32", "epoch": "i64",
                                    "heap": "*i64"}, {}))
    return out


#: kernels for the sm_90 compile check (tilecomm.device.compile_check)
COMPILE = _compile_entries()

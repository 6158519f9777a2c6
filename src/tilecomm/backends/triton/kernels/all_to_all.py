"""all_to_all kernels: pairwise all_to_all and all_to_all_v (``algorithms/pairwise.py``).

Data movement of the schedule: in step ``s`` rank ``r`` sends its chunk for ``dst = r + s``
and receives the chunk of ``src = r - s`` (mod W); step 0 is the local copy. Push form:

``pairwise_all_to_all``, grid ``(P, W)``; program ``(pid, s)`` owns blocks ``pid, pid + P, ...``
of step ``s``:

    s == 0   out[chunk rank] = x[chunk rank]                        (local copy, no signal)
    put      x[chunk dst] -> row ``rank`` of dst's staging half      (plain remote stores)
    signal   dst's slot ``pid * W + rank`` = epoch                   (release, sys)
    wait     own slot ``pid * W + src`` >= epoch                     (acquire; src raised it)
    copy     out[chunk src] = row ``src`` of own staging half

* Slot rule of the contract: slot ``g * W + p`` is written by rank ``p`` only (g = pid).
  A program waits only on the program of the same id on a peer, which signals before it
  waits: no deadlock when a grid's programs run one after another (the interpreter).
* Every program signals and waits, also with zero counts: every rank then hears from every
  peer, so a call completes only after every rank started it (contract rule 2).
* Staging: a symmetric scratch of two halves, half ``epoch % 2`` of the epoch the kernel
  loads (NOTE [device epochs] in context.py: chosen on the device, so a CUDA graph replay
  alternates too). A rank writes a peer's half
  ``h`` in call ``c``; the last call that used it is ``c - 2`` at the latest (the kernel takes
  one epoch per call), which every rank finished (rule 2). The half size is fixed per
  context and only grows after a host barrier, so calls of different sizes never lay the
  halves out differently while a peer may still read them.

all_to_all_v first runs ``all_to_all_v_counts`` (one program): every rank puts one int64 row
``[send counts | expected receive counts or -1]`` into row ``rank`` of every peer's symmetric
``W x 2W`` table (two halves by epoch parity), signals, waits for every peer and copies the
table out. Every rank then knows the whole count matrix: its receive counts (to size
``out``), the staging row size (the largest off-diagonal count: equal on all ranks, so the
symmetric allocation stays in step), and whether any rank's ``recv_counts`` disagree (then
*every* rank raises the same ``CommMismatch`` instead of a peer timing out). The counts kernel
is a full handshake, so the data kernel (same ``pairwise_all_to_all``, a fresh epoch) cannot
meet a peer still in the previous call.

Data moves as machine words: the dtype is viewed as int64 / int32 / int16 / uint8, the widest
that divides every chunk's byte length (all ranks agree), so every dtype shares one kernel per
word size.
"""

from __future__ import annotations

import math
import weakref

import torch
import triton
import triton.language as tl

from tilecomm.device import lang

from ...base import CollectiveCall  # noqa: F401  (the launcher contract's type)
from ..registry import ALL_DTYPES, kernel
from ..context import dtype_size
from .common import collective_jit, copy_blocks64, load_epoch

#: byte-moving kernels take any dtype the Communicator knows
DTYPES = ALL_DTYPES + (torch.uint8, torch.int8)

_WORDS = ((8, torch.int64), (4, torch.int32), (2, torch.int16), (1, torch.uint8))
#: words per block on a GPU (16 KiB of int64 per iteration of a program)
BLOCK_GPU = 2048


@collective_jit
def pairwise_all_to_all(x, out, staging, pad, meta, cap, heap, epoch_ptr, WORLD: tl.constexpr,
                        BLOCK: tl.constexpr, ALIGNED: tl.constexpr = 0):
    """``meta`` (int64[4, WORLD], local): send counts, send offsets (into ``x``), receive
    counts, receive offsets (into ``out``), in words. ``staging``: symmetric, 2 halves of
    ``WORLD x cap`` words, half ``epoch % 2`` used. ``cap`` is a multiple of 16 bytes' worth
    of words
    (the launcher makes it so); ``ALIGNED``: every offset in ``meta`` is too, so ``x`` and
    ``out`` are accessed with 128-bit loads and stores (the staging rows always are)."""
    rank = lang.my_rank(heap)
    WV: tl.constexpr = 128 // x.dtype.element_ty.primitive_bitwidth      # words per 16 bytes
    epoch = load_epoch(epoch_ptr)
    pid = tl.program_id(0)
    s = tl.program_id(1)
    nprog = tl.num_programs(0)
    dst = (rank + s) % WORLD
    src = (rank + WORLD - s) % WORLD
    send_n = tl.load(meta + dst)
    send_off = tl.load(meta + WORLD + dst)
    recv_n = tl.load(meta + 2 * WORLD + src)
    recv_off = tl.load(meta + 3 * WORLD + src)
    if ALIGNED:
        send_off = tl.multiple_of(send_off, WV)
        recv_off = tl.multiple_of(recv_off, WV)
    cap64 = tl.multiple_of(tl.cast(cap, tl.int64), WV)
    if s == 0:
        copy_blocks64(out + recv_off, x + send_off, send_n, pid, nprog, BLOCK)
    else:
        buf = staging + tl.multiple_of((epoch % 2) * (WORLD * cap64), WV)
        remote = lang.peer_ptr(buf + rank * cap64, dst, heap)
        copy_blocks64(remote, x + send_off, send_n, pid, nprog, BLOCK)
        lang.signal_set(pad, pid * WORLD + rank, epoch, dst, heap)
        if lang.wait_ge(pad, pid * WORLD + src, epoch, src, heap, site=1):
            copy_blocks64(out + recv_off, buf + src * cap64, recv_n, pid, nprog, BLOCK)


@collective_jit
def all_to_all_v_counts(row_in, table, table_out, pad, heap, epoch_ptr, WORLD: tl.constexpr,
                        RPOW: tl.constexpr, TPOW: tl.constexpr):
    """Row ``rank`` of every rank's symmetric ``table`` (int64, 2 halves of ``WORLD x
    2 WORLD``, half ``epoch % 2``) <- ``row_in`` (2 WORLD int64); then ``table_out`` (local)
    <- this rank's whole table half. One program; slot ``q`` is raised by rank ``q``."""
    rank = lang.my_rank(heap)
    R: tl.constexpr = 2 * WORLD
    epoch = load_epoch(epoch_ptr)
    idx = tl.arange(0, RPOW)
    m = idx < R
    row = tl.load(row_in + idx, mask=m)
    t = table + (epoch % 2) * (WORLD * R)
    for p in tl.static_range(WORLD):
        if p != rank:
            tl.store(lang.peer_ptr(t + rank * R, p, heap) + idx, row, mask=m)
            lang.signal_set(pad, rank, epoch, p, heap)
        else:
            tl.store(t + rank * R + idx, row, mask=m)
    ok = tl.cast(1, tl.int1)
    for p in tl.static_range(WORLD):
        if p != rank:
            ok = ok & lang.wait_ge(pad, p, epoch, p, heap, site=2)
    if ok:
        all_idx = tl.arange(0, TPOW)
        am = all_idx < WORLD * R
        tl.store(table_out + all_idx, tl.load(t + all_idx, mask=am), mask=am)


def _sig(word: str) -> dict:
    return {"x": f"*{word}", "out": f"*{word}", "staging": f"*{word}", "pad": "*i64",
            "meta": "*i64", "cap": "i64", "heap": "*i64", "epoch_ptr": "*i64"}


#: sm_90 compile list (tilecomm.device.compile_check): every word size, 2 and 8 ranks
COMPILE = [(pairwise_all_to_all, _sig(w), {"WORLD": 8, "BLOCK": BLOCK_GPU, "ALIGNED": a})
           for w in ("i64", "i32", "i16", "u8") for a in (0, 1)] + [
    (pairwise_all_to_all, _sig("i64"), {"WORLD": 2, "BLOCK": BLOCK_GPU, "ALIGNED": 1}),
    (all_to_all_v_counts,
     {"row_in": "*i64", "table": "*i64", "table_out": "*i64", "pad": "*i64", "heap": "*i64",
      "epoch_ptr": "*i64"},
     {"WORLD": 8, "RPOW": 16, "TPOW": 128}),
]


# ---- host side -------------------------------------------------------------------------------

def word_for(*byte_lengths: int) -> tuple[int, torch.dtype]:
    """The widest machine word (bytes, torch dtype) dividing every byte length."""
    g = 0
    for b in byte_lengths:
        g = math.gcd(g, int(b))
    for size, dt in _WORDS:
        if g % size == 0:
            return size, dt
    return 1, torch.uint8


def as_words(t: torch.Tensor, word: torch.dtype) -> torch.Tensor:
    """Flat ``t`` viewed as ``word`` (a copy if ``t`` is not contiguous or its address is not
    aligned to the word)."""
    b = t.reshape(-1).contiguous().view(torch.uint8)
    if b.data_ptr() % dtype_size(word):
        b = b.clone()
    return b.view(word)


_HALVES: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def halves(ctx, name: str, half_bytes: int) -> tuple[torch.Tensor, int]:
    """Symmetric scratch ``name`` as two halves: ``(uint8 buffer, half size in bytes)``.

    The half size is fixed per context and grows only (to at least ``half_bytes``) after a
    host barrier that follows every rank's earlier kernels: a call whose size differs from
    the previous one's must not move the halves under a peer still reading the other half.
    Every rank asks for the same sizes in the same calls (calls match), so all grow together.
    """
    sizes = _HALVES.setdefault(ctx, {})
    cur = sizes.get(name, 0)
    if half_bytes > cur:
        new = max(int(half_bytes), 2 * cur, 256)
        new = -(-new // 256) * 256
        if cur:
            ctx.heap.barrier()
        sizes[name] = cur = new
    return ctx.scratch(name, 2 * cur, torch.uint8), cur


def _block(ctx) -> int:
    """Words per block: the context's block in the interpreter (small: every op costs), a
    16 KiB block on a GPU."""
    return ctx.block if ctx.interpret else BLOCK_GPU


def _pairwise(ctx, xw, outw, send, recv, cap: int, wsize: int, word, most: int) -> None:
    """Launch the data kernel: ``send``/``recv`` word counts per rank, ``cap`` the largest
    off-diagonal count and ``most`` the largest count of the whole matrix, diagonal included
    (both the same on every rank).

    The grid is sized from ``most``, never from this rank's own counts: program ``(pid, s)``
    waits for the peer's program ``(pid, s)``, so every rank must launch the same grid (a rank
    keeping a large chunk for itself would otherwise launch programs its peers never do)."""
    w = ctx.world_size
    block = _block(ctx)
    nprog = ctx.programs(max(most, 1), block, width=w)
    # staging rows start at multiples of 16 bytes (128-bit accesses; the kernel hints it)
    row_bytes = -(-max(cap, 1) * wsize // 16) * 16
    raw, half_bytes = halves(ctx, "pairwise.staging", w * row_bytes)
    staging = raw.view(word)
    row_cap = (half_bytes // w) // 16 * 16 // wsize
    pad = ctx.signals(nprog)
    meta, aligned = _meta(ctx, tuple(send), tuple(recv), wsize)
    pairwise_all_to_all[(nprog, w)](xw, outw, staging, pad, meta, row_cap, ctx.handle,
                                    ctx.epoch_dev, WORLD=w, BLOCK=block, ALIGNED=int(aligned))


_META: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
_META_MAX = 64


def _meta(ctx, send: tuple, recv: tuple, wsize: int) -> tuple[torch.Tensor, bool]:
    """The kernel's ``meta`` table on the device and whether every offset is 16-byte aligned,
    cached per context and counts: a repeated call makes no host-to-device copy (none may
    happen while a CUDA graph is captured, and a replay reuses the captured table)."""
    cache = _META.setdefault(ctx, {})
    key = (send, recv, wsize)
    hit = cache.get(key)
    if hit is None:
        rows = [list(send), _prefix(send), list(recv), _prefix(recv)]
        aligned = all(o * wsize % 16 == 0 for o in rows[1] + rows[3])
        if len(cache) >= _META_MAX:
            cache.pop(next(iter(cache)))
        hit = cache[key] = (torch.tensor(rows, dtype=torch.int64).to(ctx.device), aligned)
    return hit


def _prefix(counts) -> list[int]:
    out, acc = [], 0
    for c in counts:
        out.append(acc)
        acc += int(c)
    return out


def _empty_words(word, device):
    return torch.empty(1, dtype=word, device=device)


@kernel("all_to_all", "pairwise", dtypes=DTYPES)
def launch_all_to_all(ctx, call) -> None:
    """``in``/``out``: ``count`` elements; chunk j (``count / W`` elements) of ``in`` goes to
    rank j, chunk j of ``out`` comes from rank j."""
    w = ctx.world_size
    x, out = call.buffers["in"], call.buffers["out"]
    if call.count % w:
        raise ValueError(f"all_to_all: {call.count} elements do not split into {w} chunks")
    chunk_bytes = call.count // w * x.element_size()
    wsize, word = word_for(chunk_bytes, 8)
    n = chunk_bytes // wsize
    if n == 0:
        xw = outw = _empty_words(word, ctx.device)
    else:
        xw = as_words(x, word)
        outw = out.view(torch.uint8).view(word) if out.data_ptr() % wsize == 0 else \
            torch.empty(n * w, dtype=word, device=ctx.device)
    _pairwise(ctx, xw, outw, [n] * w, [n] * w, n, wsize, word, n)
    if n and outw.data_ptr() != out.data_ptr():
        out.view(torch.uint8).copy_(outw.view(torch.uint8))


def exchange_counts(ctx, send, expect=None) -> list[list[int]]:
    """Device exchange of count rows (epoch ``ctx.epoch``): returns every rank's row
    ``send + expect`` (``expect``: receive counts it expects, or -1 each if unknown)."""
    w = ctx.world_size
    row = [int(c) for c in send] + ([int(c) for c in expect] if expect is not None
                                     else [-1] * w)
    table = ctx.scratch("pairwise_v.table", 2 * w * 2 * w, torch.int64)
    pad = ctx.signals(1)
    row_in = torch.tensor(row, dtype=torch.int64).to(ctx.device)
    table_out = torch.full((w * 2 * w,), -2, dtype=torch.int64, device=ctx.device)
    all_to_all_v_counts[(1,)](row_in, table, table_out, pad, ctx.handle, ctx.epoch_dev, WORLD=w,
                              RPOW=triton.next_power_of_2(2 * w),
                              TPOW=triton.next_power_of_2(2 * w * w))
    ctx.heap.check("all_to_all_v/pairwise (counts)")
    flat = table_out.cpu().tolist()
    return [flat[i * 2 * w:(i + 1) * 2 * w] for i in range(w)]


@kernel("all_to_all_v", "pairwise", dtypes=DTYPES)
def launch_all_to_all_v(ctx, call) -> None:
    """``count`` elements per row; ``send_rows[j]`` rows of ``in`` go to rank j; ``out`` (or
    ``call.make_out(total)``) receives every rank's rows in rank order. The row counts travel
    through the counts kernel; expected ``recv_rows`` are checked on every rank."""
    from ....errors import CommMismatch

    w, r = ctx.world_size, ctx.rank
    row = int(call.count)
    send_rows = [int(c) for c in call.send_rows]
    expect = None if call.recv_rows is None else [int(c) for c in call.recv_rows]
    rows = exchange_counts(ctx, send_rows, expect)
    matrix = [rw[:w] for rw in rows]              # matrix[i][j]: rows rank i sends to rank j
    bad = [(i, j, rows[j][w + i], matrix[i][j]) for i in range(w) for j in range(w)
           if rows[j][w + i] not in (-1, matrix[i][j])]
    if bad:
        i, j, want, got = bad[0]
        raise CommMismatch(f"all_to_all_v: rank {j} expects {want} rows from rank {i}, which "
                           f"sends {got} ({len(bad)} disagreement(s) in the count matrix)")
    recv_rows = [matrix[p][r] for p in range(w)]
    total = sum(recv_rows)
    out = call.buffers.get("out")
    if out is None:
        out = call.make_out(total)
    x = call.buffers["in"]
    isz = x.element_size()
    wsize, word = word_for(8, *(c * row * isz for mrow in matrix for c in mrow))
    rbytes = row * isz                                 # the word divides every chunk's bytes

    def words(rows: int) -> int:
        return rows * rbytes // wsize

    send = [words(c) for c in send_rows]
    recv = [words(c) for c in recv_rows]
    cap = max([words(matrix[i][j]) for i in range(w) for j in range(w) if i != j] or [0])
    xw = as_words(x, word) if sum(send) else _empty_words(word, ctx.device)
    if sum(recv) == 0:
        outw = _empty_words(word, ctx.device)
    elif out.is_contiguous() and out.data_ptr() % wsize == 0:
        outw = out.reshape(-1).view(torch.uint8).view(word)
    else:
        outw = torch.empty(sum(recv), dtype=word, device=ctx.device)
    most = max(words(c) for mrow in matrix for c in mrow)
    ctx.next_epoch()
    _pairwise(ctx, xw, outw, send, recv, cap, wsize, word, most)
    if sum(recv) and outw.data_ptr() != out.data_ptr():
        out.reshape(-1).view(torch.uint8).copy_(outw.view(torch.uint8))

"""broadcast kernel: direct (``algorithms/direct.py``: every non-root rank copies the root's
buffer).

Choice: **non-roots get** (pull) from a symmetric copy on the root, rather than the root
putting into every peer. Pull moves the fewest bytes: the root writes its buffer once (into
its staging half) and each non-root reads it once, remotely, straight into its own buffer;
push would make the root read its buffer W-1 times and each non-root copy staging -> buffer
once more. With zero copy (every rank's ``buf`` is a heap tensor at the same offset) the root
does not even stage: peers read its ``buf`` directly.

``direct_broadcast``, grid ``(P,)``; program ``pid`` owns blocks ``pid, pid + P, ...``:

    arrive   program 0: slot ``G * W + rank`` of every peer = epoch (G = the arrival group)
    root     [copy its blocks of buf -> staging half ``epoch % 2``]  (skipped with zero copy)
             slot ``pid * W + root`` of every peer = epoch                (release: published)
             [zero copy: wait slot ``pid * W + q`` >= epoch of every q]   (peers done reading)
    other    wait slot ``pid * W + root`` >= epoch; get its blocks of the root's source
             [zero copy: slot ``pid * W + rank`` of the root = epoch]     (done reading)
    end      program 0: wait slot ``G * W + q`` >= epoch of every q       (all ranks started)

* Slot rule: slot ``g * W + p`` is written by rank ``p`` only.
* Contract rule 2 (a call completes only after every rank started it): the final arrival
  wait. It costs the root nothing on its data path (it publishes first) and almost never
  blocks a non-root, which already heard from the root.
* Buffer reuse: the root writes staging half ``h = epoch % 2`` (chosen in the kernel from the
  epoch it loads) in call ``c``; its last reader
  was call ``c - 2`` at the latest (one epoch per call), finished by every rank (rule 2). The
  half size only grows after a host barrier (``all_to_all.halves``). With zero copy, the
  root returns only after every peer read its ``buf`` (the caller may overwrite it next).
* Per-program slots: a non-root program waits on the root's program with the same id, the
  root's programs wait on the same-id programs of the peers (zero copy), program 0 on the
  peers' programs 0, each of which signals before it waits: no deadlock when programs run
  one after another (the interpreter).

Data moves as machine words (int64/int32/int16/uint8 views), so any dtype works.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from tilecomm.device import lang

from ..registry import kernel
from .all_to_all import BLOCK_GPU, DTYPES, as_words, halves, word_for
from .common import collective_jit, copy_blocks64, load_epoch, parity_half


@collective_jit
def direct_broadcast(buf, src, half, pad, n, root, arrive_group, heap, epoch_ptr,
                     WORLD: tl.constexpr, BLOCK: tl.constexpr, STAGE: tl.constexpr):
    """``buf``: local, ``n`` words (the root's input, every other rank's output). ``src``:
    symmetric, the words peers read: the root's staging halves (``half`` words apart, half
    ``epoch % 2`` used; ``STAGE``: the root copies ``buf`` into it first), or ``buf`` itself
    (zero copy, ``half = 0``)."""
    rank = lang.my_rank(heap)
    epoch = load_epoch(epoch_ptr)
    src = parity_half(src, half, epoch)
    pid = tl.program_id(0)
    nprog = tl.num_programs(0)
    if pid == 0:
        for p in tl.static_range(WORLD):
            if p != rank:
                lang.signal_set(pad, arrive_group * WORLD + rank, epoch, p, heap)
    if rank == root:
        if STAGE:
            copy_blocks64(src, buf, n, pid, nprog, BLOCK)
        for p in tl.static_range(WORLD):
            if p != rank:
                lang.signal_set(pad, pid * WORLD + rank, epoch, p, heap)
        if not STAGE:
            for p in tl.static_range(WORLD):
                if p != rank:
                    lang.wait_ge(pad, pid * WORLD + p, epoch, p, heap, site=3)
    else:
        if lang.wait_ge(pad, pid * WORLD + root, epoch, root, heap, site=1):
            copy_blocks64(buf, lang.peer_ptr(src, root, heap), n, pid, nprog, BLOCK)
            if not STAGE:
                lang.signal_set(pad, pid * WORLD + rank, epoch, root, heap)
    if pid == 0:
        for p in tl.static_range(WORLD):
            if p != rank:
                lang.wait_ge(pad, arrive_group * WORLD + p, epoch, p, heap, site=2)


def _sig(word: str) -> dict:
    return {"buf": f"*{word}", "src": f"*{word}", "half": "i32", "pad": "*i64", "n": "i64",
            "root": "i32", "arrive_group": "i32", "heap": "*i64", "epoch_ptr": "*i64"}


#: sm_90 compile list (tilecomm.device.compile_check): every word size, staged and zero copy
COMPILE = [(direct_broadcast, _sig(w), {"WORLD": 8, "BLOCK": BLOCK_GPU, "STAGE": 1})
           for w in ("i64", "i32", "i16", "u8")] + [
    (direct_broadcast, _sig("i64"), {"WORLD": 8, "BLOCK": BLOCK_GPU, "STAGE": 0}),
    (direct_broadcast, _sig("i64"), {"WORLD": 2, "BLOCK": BLOCK_GPU, "STAGE": 1})]


@kernel("broadcast", "direct", dtypes=DTYPES)
def launch_broadcast(ctx, call) -> None:
    """``buf``: ``count`` elements; the root's is copied into every other rank's."""
    w = ctx.world_size
    buf = call.buffers["buf"]
    nbytes = call.count * buf.element_size()
    wsize, word = word_for(nbytes, 8)
    n = nbytes // wsize
    block = ctx.block if ctx.interpret else BLOCK_GPU
    nprog = ctx.programs(max(n, 1), block)
    zero_copy = bool(ctx.zero_copy) and n > 0 and buf.data_ptr() % wsize == 0
    if n == 0:
        bw = torch.empty(1, dtype=word, device=ctx.device)
    elif buf.data_ptr() % wsize == 0:
        bw = buf.view(torch.uint8).view(word)
    else:
        bw = as_words(buf, word)
    if zero_copy:
        src, half = bw, 0
    else:       # both halves; the kernel picks half epoch % 2 (NOTE [device epochs])
        raw, half_bytes = halves(ctx, "direct_broadcast.staging", max(n, 1) * wsize)
        src, half = raw.view(word), half_bytes // wsize
    # groups 0..nprog-1: publish/done per program; group nprog: arrivals
    pad = ctx.signals(nprog + 1)
    direct_broadcast[(nprog,)](bw, src, half, pad, n, call.root, nprog, ctx.handle, ctx.epoch_dev,
                               WORLD=w, BLOCK=block, STAGE=0 if zero_copy else 1)
    if n and bw.data_ptr() != buf.data_ptr() and ctx.rank != call.root:
        buf.view(torch.uint8).copy_(bw.view(torch.uint8))

"""The KV copy kernel and the device-side wait for a layer (Triton; imports triton).

One launch moves a whole push into the receiver's cache: every (layer, K/V, run of blocks) of
:func:`tilecomm.kv.schedule.transfers` is cut into tiles of up to ``ROWS`` rows, one program
per tile (the table :func:`tilecomm.kv.paths.copy_tiles` builds). A row is a whole block when
all heads move, or one token slot's heads of a head split; rows of one push have the same
length and the same stride on each side, so one table of (source offset, destination
offset, rows, layer) describes any push.

Ordering (NOTE [layer flag]): a program stores its tile into the peer's cache, then adds one
to its layer's counter (acq_rel, system scope; Triton puts a CTA barrier before a scalar
atomic, so the add follows every thread's stores). The program whose add completes the
layer's count stores the request's generation into the receiver's flag with
``lang.signal_set`` (release, system scope): it acquired every other program's add, so every
tile of the layer is visible to a receiver that acquires the flag. Counters are zeroed per
launch (a tensor of the launch's own), so pushes on different streams never share one.

Words: the caches are read as int32 (or int16 / int8 when a row or an offset is not a multiple
of 4 bytes); with ``VEC`` = 4 the offsets are hinted multiples of 16 bytes, and Triton's
16-divisibility of the strides and the 256-byte heap alignment (``lang.peer_ptr``) make the
accesses 128-bit (tests/kv checks the PTX).
"""

from __future__ import annotations

import triton
import triton.language as tl

from ..device import lang

#: words of a tile table row: source offset, destination offset, rows, layer (in words)
TILE_FIELDS = 4


# The counts, the generation and the peer change from push to push: unspecialized, so a push
# of one layer (ntiles == 1 ...) or to local rank 1 compiles no variant of its own. The row
# length and strides stay specialized: their divisibility by 16 is what makes the accesses
# 128-bit, and they are fixed per pair of cache geometries.
@triton.jit(do_not_specialize=["ntiles", "nlayers", "gen", "peer"])
def kv_copy_kernel(src, dst, flags, table, counts, ntiles, nlayers, gen, peer, heap,
                   row_words, src_stride, dst_stride,
                   ROWS: tl.constexpr, COLS: tl.constexpr, VEC: tl.constexpr):
    """Program ``t`` copies tile ``t`` of ``table`` (int64 ``[ntiles, 4]``, then ``need``
    (tiles per layer) and ``flag_at`` (each layer's flag index), ``nlayers`` words each) from
    ``src`` (this rank's cache, as words) into ``peer``'s copy of ``dst`` (this rank's copy of
    the symmetric cache), then completes its layer (NOTE [layer flag])."""
    t = tl.program_id(0)
    row = table + t * 4
    s_off = tl.multiple_of(tl.load(row), VEC)
    d_off = tl.multiple_of(tl.load(row + 1), VEC)
    nrows = tl.load(row + 2)
    li = tl.load(row + 3)
    out = lang.peer_ptr(dst, peer, heap)
    rows = tl.arange(0, ROWS)
    cols = tl.arange(0, COLS)
    rmask = rows < nrows
    s_rows = src + s_off + rows.to(tl.int64)[:, None] * src_stride
    d_rows = out + d_off + rows.to(tl.int64)[:, None] * dst_stride
    for c0 in range(0, row_words, COLS):
        c = c0 + cols
        m = rmask[:, None] & (c < row_words)[None, :]
        tl.store(d_rows + c[None, :], tl.load(s_rows + c[None, :], mask=m), mask=m)
    need = tl.load(table + ntiles * 4 + li)
    old = tl.atomic_add(counts + li, 1, sem="acq_rel", scope="sys")
    if old + 1 == need:
        lang.signal_set(flags, tl.load(table + ntiles * 4 + nlayers + li), gen, peer, heap)


def launch_copy(ct, src, dst, flags, table, counts, gen: int, peer: int, heap) -> None:
    """Launch :func:`kv_copy_kernel` for the tile table ``ct`` (``tilecomm.kv.paths.
    CopyTiles``; ``table`` its ``table`` on the device, ``counts`` int32 zeros, one per
    layer): ``src`` and ``dst`` viewed as ``ct.word_bytes`` words, ``dst`` (and ``flags``)
    this rank's copy of a symmetric buffer, rebased to local rank ``peer``. A push passes
    the symmetric cache as both."""
    kv_copy_kernel[(ct.ntiles,)](
        src, dst, flags, table, counts, ct.ntiles, ct.nlayers, gen, peer, heap,
        ct.row_words, ct.src_stride, ct.dst_stride, ROWS=ct.rows, COLS=ct.cols, VEC=ct.vec)


def copy_pieces(path: str, a, b, flag, pieces: int, nbytes: int, me: int, heap) -> None:
    """``b[:nbytes] = a[:nbytes]`` (uint8 tensors of one device) in ``pieces`` equal pieces, as
    a push of ``pieces`` transfers would move them: one copy per piece (``"copy_engine"``)
    or one launch of :func:`kv_copy_kernel` over tiles cut as a push's are
    (``paths.piece_tiles``, ``"kernel"``); then ``flag[0] = 1``. ``me``: this rank's local
    rank (the kernel's peer, so nothing is rebased). What ``path="auto"`` times to fit its
    costs (paths.measure_cuda).
    """
    import torch

    from .paths import piece_tiles

    piece = nbytes // pieces
    if path == "copy_engine":
        for k in range(pieces):
            b[k * piece:(k + 1) * piece].copy_(a[k * piece:(k + 1) * piece])
        flag[:1].fill_(1)
        return
    ct = piece_tiles(pieces, piece)
    counts = torch.zeros(1, dtype=torch.int32, device=a.device)
    launch_copy(ct, a.view(torch.int32), b.view(torch.int32), flag,
                torch.from_numpy(ct.table).to(a.device), counts, 1, me, heap)


@triton.jit
def wait_layer(flags, first, stride, nsrc, gen, srcs, heap):
    """Inside any kernel: wait until each of ``nsrc`` senders' flag of a layer (``flags
    [first + j * stride]``) holds ``gen`` or more (acquire, system scope), bounded by the
    heap's wait bound; True when all arrived. ``srcs``: int64 sender ranks (for the error
    record only). The arguments come from ``ExpectHandle.device_wait_args(layer)``."""
    arrived = 0
    for j in range(nsrc):
        got = lang.wait_ge(flags, first + j * stride, gen, tl.load(srcs + j), heap, site=7)
        arrived += got.to(tl.int32)
    return arrived == nsrc


@triton.jit
def kv_wait_layer_kernel(flags, first, stride, nsrc, gen, srcs, heap):
    """One program that waits for a layer (:func:`wait_layer`), queued on a stream so the
    kernels behind it start once the layer has landed."""
    wait_layer(flags, first, stride, nsrc, gen, srcs, heap)


#: for ``python -m tilecomm.device.compile_check``
COMPILE = [
    (kv_copy_kernel, {"src": "*i32", "dst": "*i32", "flags": "*i64", "table": "*i64",
                      "counts": "*i32", "ntiles": "i32", "nlayers": "i32", "gen": "i64",
                      "peer": "i32", "heap": "*i64", "row_words": "i64", "src_stride": "i64",
                      "dst_stride": "i64"},
     {"ROWS": 1, "COLS": 2048, "VEC": 4}),
    (kv_wait_layer_kernel, {"flags": "*i64", "first": "i64", "stride": "i64", "nsrc": "i32",
                            "gen": "i64", "srcs": "*i64", "heap": "*i64"}, {}),
]

"""How a push moves its data inside a host: the copy kernel's tile table, and ``path="auto"``.

Two paths (``push(..., path=)``), both from the same list of transfers
(:func:`tilecomm.kv.schedule.transfers`), both ending with the receiver's layer flags set
after their data:

* ``"kernel"``: one launch of :func:`tilecomm.kv.kernel.kv_copy_kernel` over the tile table
  built here (:func:`copy_tiles`), the flags set by the kernel (NOTE [layer flag]). On CPU
  caches it runs in the Triton interpreter: a correctness vehicle, never fast.
* ``"copy_engine"``: one copy per transfer into the receiver's cache as this process maps it
  (``DeviceHeap.peer_view``): ``cudaMemcpyAsync`` device to device on CUDA caches, a memcpy
  on CPU caches; each layer's flag stored after its copies, in stream order.

``"auto"`` (:class:`PathChooser`) predicts each path's time from a cost fitted on this
device, ``launch + transfers x per_transfer + bytes / bandwidth``, and takes the lower. On
CUDA the fit is measured once per engine (:func:`measure_cuda`, about 50 ms, at the first
``auto`` push). On CPU caches ``auto`` is the copy path: the kernel path there is the
interpreter.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch

from .schedule import CacheGeometry, HeadSplit, Transfer

PATHS = ("kernel", "copy_engine")
#: words (int32) one program of the copy kernel moves at most
TILE_WORDS = 4096
#: columns a program's tile holds at most (the rest of a longer row is a loop)
MAX_COLS = 2048


@dataclass
class CopyTiles:
    """What one launch of the copy kernel takes (offsets and strides in words of
    ``word_bytes`` bytes from the start of the symmetric cache)."""

    table: np.ndarray       # int64: ntiles x (src off, dst off, rows, layer idx), need, flag_at
    ntiles: int
    nlayers: int
    word_bytes: int
    row_words: int
    src_stride: int
    dst_stride: int
    rows: int               # ROWS (constexpr): rows per tile
    cols: int               # COLS (constexpr)
    vec: int                # VEC (constexpr): offsets are multiples of vec words


def copy_tiles(moves: list[Transfer], src: CacheGeometry, dst: CacheGeometry, hs: HeadSplit,
               lo: int, flag_at: list[int], whole: bool, limit_bytes: int) -> CopyTiles:
    """The tile table of a push: ``moves`` (layers ``lo ..``) from a cache of geometry ``src``
    to one of ``dst``; ``flag_at[i]``: the flag index of layer ``lo + i``; ``limit_bytes``:
    bytes of the symmetric buffer both caches live in (word size must divide it)."""
    isz = src.itemsize
    if whole:        # a row is a whole block: a run of n blocks is n rows, contiguous
        row_bytes = src_stride = dst_stride = src.block_bytes
        head_s = head_d = 0
        rows_per_block = 1
    else:            # a row is one token slot's heads of the split
        row_bytes = hs.count * src.head_dim * isz
        src_stride = src.kv_heads * src.head_dim * isz
        dst_stride = dst.kv_heads * dst.head_dim * isz
        head_s, head_d = hs.src * src.head_dim * isz, hs.dst * dst.head_dim * isz
        rows_per_block = src.block_size
    g = math.gcd(row_bytes, src_stride, dst_stride, head_s, head_d, src.block_bytes,
                 dst.block_bytes, limit_bytes)
    word = 4 if g % 4 == 0 else 2 if g % 2 == 0 else 1
    vec = 4 if word == 4 and g % 16 == 0 else 1
    m = np.array([(t.layer, t.kv, t.run.src, t.run.dst, t.run.n) for t in moves],
                 dtype=np.int64).reshape(-1, 5)
    s_off = ((m[:, 0] * 2 + m[:, 1]) * src.blocks + m[:, 2]) * src.block_bytes + head_s
    d_off = ((m[:, 0] * 2 + m[:, 1]) * dst.blocks + m[:, 3]) * dst.block_bytes + head_d
    return cut_tiles(s_off, d_off, m[:, 4] * rows_per_block, m[:, 0] - lo, flag_at,
                     row_bytes, src_stride, dst_stride, word, vec)


def cut_tiles(s_off: np.ndarray, d_off: np.ndarray, nrows: np.ndarray, layer: np.ndarray,
              flag_at: list[int], row_bytes: int, src_stride: int, dst_stride: int, word: int,
              vec: int) -> CopyTiles:
    """Cut transfers (byte offsets ``s_off`` / ``d_off``, ``nrows`` rows of ``row_bytes``,
    layer index ``layer``) into tiles of at most ``TILE_WORDS`` words: the one way every
    launch of the copy kernel is cut, a push's (:func:`copy_tiles`) and what ``auto`` times
    (:func:`piece_tiles`)."""
    row_words = row_bytes // word
    cols = min(MAX_COLS, 1 << max(0, (row_words - 1).bit_length()))
    rows = max(1, min(1 << max(0, (int(nrows.max()) - 1).bit_length()), TILE_WORDS // cols))
    per = -(-nrows // rows)                                  # tiles of each transfer
    first = np.repeat(np.arange(len(nrows)), per)
    k = np.arange(len(first)) - np.repeat(np.cumsum(per) - per, per)
    tiles = np.empty((len(first), 4), dtype=np.int64)
    tiles[:, 0] = (s_off[first] + k * rows * src_stride) // word
    tiles[:, 1] = (d_off[first] + k * rows * dst_stride) // word
    tiles[:, 2] = np.minimum(rows, nrows[first] - k * rows)
    tiles[:, 3] = layer[first]
    nlayers = len(flag_at)
    need = np.bincount(tiles[:, 3], minlength=nlayers).astype(np.int64)
    table = np.concatenate([tiles.reshape(-1), need, np.asarray(flag_at, dtype=np.int64)])
    return CopyTiles(table, len(tiles), nlayers, word, row_words, src_stride // word,
                     dst_stride // word, rows, cols, vec)


def piece_tiles(pieces: int, piece_bytes: int) -> CopyTiles:
    """The tiles of ``pieces`` transfers of one whole-block row of ``piece_bytes`` each (a
    multiple of 16), back to back, one layer whose flag is word 0: what a push of
    ``pieces`` runs of one block of that size is cut into."""
    off = np.arange(pieces, dtype=np.int64) * piece_bytes
    return cut_tiles(off, off, np.ones(pieces, dtype=np.int64),
                     np.zeros(pieces, dtype=np.int64), [0], piece_bytes, piece_bytes,
                     piece_bytes, 4, 4)


class PathChooser:
    """``path="auto"``: the path with the lower predicted time. ``costs[path] = (launch s,
    s per transfer, bytes per s)``, fitted by :meth:`fit` on measured pushes; with no costs
    (CPU caches) the copy path."""

    def __init__(self, costs: dict[str, tuple[float, float, float]] | None = None):
        self.costs = dict(costs or {})

    def predict(self, path: str, transfers: int, nbytes: int) -> float:
        launch, per, bw = self.costs[path]
        return launch + transfers * per + nbytes / bw

    def choose(self, transfers: int, nbytes: int) -> str:
        if not self.costs:
            return "copy_engine"
        # ties to the copy engine: it leaves the SMs to the model's kernels
        return min(sorted(self.costs, key=lambda p: p != "copy_engine"),
                   key=lambda p: self.predict(p, transfers, nbytes))

    @classmethod
    def fit(cls, samples: dict[str, list[tuple[int, int, float]]]) -> "PathChooser":
        """Least squares of ``seconds = launch + transfers x per + bytes / bw`` per path over
        ``(transfers, bytes, seconds)`` samples (at least three, varying both); negative
        terms are clipped to 0 (noise), bandwidth to at least 1 byte/s."""
        costs = {}
        for path, rows in samples.items():
            a = np.array([(1.0, t, b) for t, b, _ in rows])
            y = np.array([s for _, _, s in rows])
            (launch, per, inv_bw), *_ = np.linalg.lstsq(a, y, rcond=None)
            costs[path] = (max(0.0, float(launch)), max(0.0, float(per)),
                           1.0 / max(float(inv_bw), 1e-12))
        return cls(costs)

    def describe(self) -> str:
        if not self.costs:
            return "copy_engine (CPU caches: the kernel path is the Triton interpreter)"
        return "; ".join(f"{p}: {c[0] * 1e6:.1f} us + {c[1] * 1e6:.2f} us/transfer, "
                         f"{c[2] / 1e9:.1f} GB/s" for p, c in sorted(self.costs.items()))


def measure_cuda(run_path, device: torch.device, reps: int = 5) -> PathChooser:
    """Fit :class:`PathChooser` on this device: ``run_path(path, transfers, nbytes)`` queues
    one push-like copy of ``nbytes`` in ``transfers`` pieces on the current stream (the
    engine's own scratch, no peer involved); each shape is timed with CUDA events, median of
    ``reps``."""
    shapes = [(1, 1 << 20), (1, 16 << 20), (256, 1 << 20), (256, 16 << 20)]
    samples: dict = {p: [] for p in PATHS}
    for path in PATHS:
        run_path(path, *shapes[0])                           # compile / warm up
        for t, b in shapes:
            times = []
            for _ in range(reps):
                e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                e0.record()
                run_path(path, t, b)
                e1.record()
                e1.synchronize()
                times.append(e0.elapsed_time(e1) / 1e3)
            samples[path].append((t, b, float(np.median(times))))
    torch.cuda.synchronize(device)
    return PathChooser.fit(samples)

"""What a KV-cache transfer moves: cache geometry, block runs, and the list of transfers.

One definition of a request's transfers, used by every engine (the shared-memory copy path,
the inter-host message path) and by the performance model (``tilecomm model --mode serve``),
so what is timed is what runs.

A cache is a tensor ``[L, 2, B, S, H, D]``: per layer ``l``, K (``kv=0``) then V (``kv=1``),
each ``B`` blocks of ``S`` token slots x ``H`` heads x ``D`` channels. For fixed ``(l, kv)``
the blocks ``b .. b+n-1`` are one contiguous range of memory, so a run of consecutive block
ids on both sides moves as one transfer (descriptor coalescing) instead of one per block.
"""

from __future__ import annotations

import operator
from dataclasses import dataclass
from typing import Sequence

import torch

from ..agree import Descriptor


#: a cache geometry as the ranks exchange it (``CacheGeometry.words``)
GEOMETRY = Descriptor("layers", "blocks", "block_size", "kv_heads", "head_dim", "dtype")

#: dtypes a cache may hold, by the id the ranks exchange. The engine only moves bytes, so
#: 8-bit float caches (fp8 e4m3 / e5m2, as vLLM's ``kv_cache_dtype="fp8"``) are as good as
#: any; the collectives' dtype table (tilecomm.types) lists only what they can reduce or
#: stage, which is why these ids are kept here.
CACHE_DTYPES = {1: torch.float32, 3: torch.float16, 4: torch.bfloat16, 7: torch.uint8,
                8: torch.int8, 20: torch.float8_e4m3fn, 21: torch.float8_e5m2}
_DTYPE_ID = {d: i for i, d in CACHE_DTYPES.items()}


def cache_dtype_id(dtype: torch.dtype) -> int:
    """The exchanged id of a cache dtype; TypeError naming the supported ones."""
    i = _DTYPE_ID.get(dtype)
    if i is None:
        names = ", ".join(str(d).removeprefix("torch.") for d in CACHE_DTYPES.values())
        raise TypeError(f"paged_cache: dtype {dtype} is not supported; use one of {names}")
    return i


@dataclass(frozen=True)
class CacheGeometry:
    """One rank's paged cache: ``[layers, 2, blocks, block_size, kv_heads, head_dim]``."""

    layers: int
    blocks: int
    block_size: int
    kv_heads: int
    head_dim: int
    dtype: torch.dtype

    def __post_init__(self):
        for name in ("layers", "blocks", "block_size", "kv_heads", "head_dim"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"paged_cache: {name} must be a positive int, got {v!r}")
        cache_dtype_id(self.dtype)

    @property
    def shape(self) -> tuple[int, ...]:
        return (self.layers, 2, self.blocks, self.block_size, self.kv_heads, self.head_dim)

    @property
    def itemsize(self) -> int:
        return torch.empty((), dtype=self.dtype).element_size()

    @property
    def nbytes(self) -> int:
        return self.layers * 2 * self.blocks * self.block_bytes

    @property
    def block_bytes(self) -> int:
        """Bytes of one block of one layer's K (or V)."""
        return self.block_size * self.kv_heads * self.head_dim * self.itemsize

    def words(self) -> list[int]:
        """The geometry as ints, for exchanging between ranks (:data:`GEOMETRY`)."""
        return GEOMETRY.pack(layers=self.layers, blocks=self.blocks, block_size=self.block_size,
                             kv_heads=self.kv_heads, head_dim=self.head_dim,
                             dtype=cache_dtype_id(self.dtype))

    @classmethod
    def from_words(cls, w: Sequence[int]) -> "CacheGeometry":
        g = lambda name: GEOMETRY.get(w, name)  # noqa: E731
        return cls(g("layers"), g("blocks"), g("block_size"), g("kv_heads"), g("head_dim"),
                   CACHE_DTYPES[g("dtype")])

    def describe(self) -> str:
        return (f"{self.layers} layers x {self.blocks} blocks x {self.block_size} slots x "
                f"{self.kv_heads} heads x {self.head_dim} dims, "
                f"{str(self.dtype).removeprefix('torch.')}")


@dataclass(frozen=True)
class HeadSplit:
    """Heads ``[src, src + count)`` of the sender's cache land in heads ``[dst, dst + count)``
    of the receiver's (tensor-parallel layouts that differ between prefill and decode)."""

    src: int
    dst: int
    count: int

    @classmethod
    def whole(cls, heads: int) -> "HeadSplit":
        return cls(0, 0, heads)

    def is_whole(self, src_heads: int, dst_heads: int) -> bool:
        return self.src == 0 and self.dst == 0 and self.count == src_heads == dst_heads


@dataclass(frozen=True)
class Run:
    """Blocks ``src .. src+n-1`` of the sender go to blocks ``dst .. dst+n-1`` of the
    receiver (both contiguous)."""

    src: int
    dst: int
    n: int


@dataclass(frozen=True)
class Transfer:
    """One contiguous move: layer ``layer``, K or V (``kv``), one :class:`Run`."""

    layer: int
    kv: int
    run: Run


def coalesce(src_ids: Sequence[int], dst_ids: Sequence[int]) -> list[Run]:
    """Maximal runs where both the source and the destination ids are consecutive.

    ``src_ids[i]`` moves to ``dst_ids[i]``; both lists have the same length.
    >>> coalesce([4, 5, 6, 9], [0, 1, 7, 8])
    [Run(src=4, dst=0, n=2), Run(src=6, dst=7, n=1), Run(src=9, dst=8, n=1)]
    """
    if len(src_ids) != len(dst_ids):
        raise ValueError(f"{len(src_ids)} source blocks for {len(dst_ids)} destination blocks")
    runs: list[Run] = []
    for s, d in zip(src_ids, dst_ids):
        s, d = int(s), int(d)
        last = runs[-1] if runs else None
        if last is not None and s == last.src + last.n and d == last.dst + last.n:
            runs[-1] = Run(last.src, last.dst, last.n + 1)
        else:
            runs.append(Run(s, d, 1))
    return runs


def transfers(runs: Sequence[Run], layers: Sequence[int]) -> list[Transfer]:
    """Every move of a push, layer by layer (K then V), in the order both sides use."""
    return [Transfer(l, kv, r) for l in layers for kv in (0, 1) for r in runs]


def check_block_ids(ids, geometry: CacheGeometry, what: str) -> list[int]:
    """``ids`` as a list of ints, or ValueError naming the first bad one."""
    if isinstance(ids, torch.Tensor):
        if ids.dtype.is_floating_point or ids.dim() != 1:
            raise ValueError(f"{what}: block_ids must be a 1-d integer tensor or a list of "
                             f"ints, got a {ids.dim()}-d {ids.dtype} tensor")
        ids = ids.tolist()
    try:      # operator.index: ints and numpy/torch integers, never a float truncated
        out = [operator.index(i) for i in ids]
    except TypeError:
        raise ValueError(f"{what}: block_ids must be ints, got {ids!r}") from None
    if any(isinstance(i, bool) for i in ids):
        raise ValueError(f"{what}: block_ids must be ints, got {ids!r}")
    if not out:
        raise ValueError(f"{what}: block_ids is empty")
    for k, b in enumerate(out):
        if not 0 <= b < geometry.blocks:
            raise ValueError(f"{what}: block id {b} (position {k}) is out of range "
                             f"[0, {geometry.blocks})")
    if len(set(out)) != len(out):
        seen = set()
        dup = next(b for b in out if b in seen or seen.add(b))
        raise ValueError(f"{what}: block id {dup} appears twice")
    return out


def request_bytes(geometry: CacheGeometry, nblocks: int, layers: int | None = None,
                  heads: int | None = None) -> int:
    """Bytes of ``nblocks`` blocks over ``layers`` layers (K and V), ``heads`` of the heads."""
    layers = geometry.layers if layers is None else layers
    heads = geometry.kv_heads if heads is None else heads
    return layers * 2 * nblocks * geometry.block_bytes * heads // geometry.kv_heads

"""FP8 dispatch: token rows as float8 e4m3 with one float32 scale per 128 channels.

``quantize`` runs on the source before any row moves (the same torch ops whatever engine moves
the rows, so every engine gives the same bytes); the rows and their scales travel together and
``dequantize`` restores a bfloat16/float32 approximation on the receiver. The scale of a block
is ``amax(|x|) * (1/448)`` (448: e4m3's largest finite value; ``1/448`` rounded to float32), so
the largest entry of every block maps to +-448 and nothing saturates; an all-zero block gets
scale 1. A multiplication, not ``amax / 448``: CUDA divides a tensor by a scalar as a multiply
by the reciprocal, the CPU divides, so the division gave other scale bits on the GPU than on
the CPU (seen on an H200); a product of two float32 values rounds the same on both.
"""

from __future__ import annotations

import torch

DTYPE = torch.float8_e4m3fn
BLOCK = 128
FP8_MAX = 448.0
#: 1/448 as a float32 value (exact in float32 arithmetic on every device)
_INV_MAX = float(torch.tensor(1.0 / FP8_MAX, dtype=torch.float32))


def scale_blocks(hidden: int) -> int:
    if hidden % BLOCK:
        raise ValueError(f"fp8 dispatch needs hidden ({hidden}) to be a multiple of {BLOCK} "
                         f"(one scale per {BLOCK} channels)")
    return hidden // BLOCK


#: rows per pass on CPU tensors: about 2 MiB of float32, so a pass's temporaries stay in cache
#: and are reused instead of being fresh memory the size of x (page faults made the one-pass
#: version 6x slower at 4096 x 7168: 163 against 24-27 ms, docs/benchmarks.md)
_CPU_CHUNK_BYTES = 1 << 21


def quantize(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``x [T, H]`` (any float dtype) -> ``(q [T, H] float8_e4m3fn, scales [T, H/128] float32)``.

    Rows are independent, so doing them in passes (CPU) or at once (GPU: one launch per op)
    gives the same bytes; ``max(amax, -amin)`` is ``amax(|x|)`` without a temporary."""
    t, h = x.shape
    nb = scale_blocks(h)
    q = torch.empty((t, h), dtype=DTYPE, device=x.device)
    scales = torch.empty((t, nb), dtype=torch.float32, device=x.device)
    one = torch.ones((), dtype=torch.float32, device=x.device)
    step = max(1, _CPU_CHUNK_BYTES // (4 * h)) if x.device.type == "cpu" else max(t, 1)
    for lo in range(0, t, step):
        # a copy even from float32: the division below is in place
        xf = x[lo:lo + step].to(torch.float32, copy=True).reshape(-1, nb, BLOCK)
        amax = torch.maximum(xf.amax(dim=-1), -xf.amin(dim=-1))
        s = torch.where(amax > 0, amax * _INV_MAX, one)
        scales[lo:lo + step] = s
        q[lo:lo + step] = xf.div_(s.unsqueeze(-1)).to(DTYPE).reshape(-1, h)
    return q, scales


def dequantize(q: torch.Tensor, scales: torch.Tensor, dtype: torch.dtype = torch.bfloat16
               ) -> torch.Tensor:
    """Inverse of :func:`quantize` up to e4m3's rounding: ``[..., H]`` in ``dtype``."""
    *lead, h = q.shape
    blocks = q.to(torch.float32).reshape(*lead, h // BLOCK, BLOCK) * scales.unsqueeze(-1)
    return blocks.reshape(*lead, h).to(dtype)

"""Deterministic test data whose reductions are exact in every dtype and any order."""

from __future__ import annotations

import torch

ALL_DTYPES = [torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int32,
              torch.int64]
MOVE_DTYPES = ALL_DTYPES + [torch.uint8, torch.int8]


def make(seed: int, rank: int, shape, dtype: torch.dtype, op: str = "sum") -> torch.Tensor:
    """Small integers (products of <= 4 of them stay exact even in bfloat16)."""
    g = torch.Generator().manual_seed(seed * 1009 + rank)
    if op == "prod":
        vals = torch.tensor([-1, 1, 2, 1])[torch.randint(0, 4, tuple(shape), generator=g)]
    else:
        lo = 0 if dtype == torch.uint8 else -8
        vals = torch.randint(lo, 9, tuple(shape), generator=g)
    return vals.to(dtype)


def random_values(seed: int, n: int, dtype: torch.dtype) -> torch.Tensor:
    """``n`` random values: floats N(0, 9) (not integer-valued: float bugs show), integers over
    the whole range (sums and products wrap)."""
    g = torch.Generator().manual_seed(seed)
    if dtype.is_floating_point:
        return (torch.randn(n, generator=g, dtype=torch.float64) * 3).to(dtype)
    info = torch.iinfo(dtype)
    return torch.randint(info.min, info.max, (n,), generator=g, dtype=dtype)

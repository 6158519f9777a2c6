"""Synthetic MoE inputs and stand-in experts, for checks and benchmarks that compare engines
with :mod:`.reference`.

Inputs are made from ``(seed, rank)`` alone, so any process rebuilds every rank's inputs. The
experts' "outputs" are deterministic functions of the rows (expert ``e`` scales by ``e + 1``
and adds the local rank), so a wrong row, a wrong weight or a wrong order shows in the bits.
"""

from __future__ import annotations

import torch

from . import routing
from .dispatched import weighted_rows


def inputs(rank: int, tokens: int, *, h: int = 256, k: int = 4, e: int = 8,
           dtype=torch.bfloat16, seed: int = 0, integer: bool = False, drop: float = 0.2):
    """``x [T, H]`` (random, or small integers), ``topk_idx [T, K]`` (distinct experts, some
    -1, token 0 routed nowhere), ``topk_weights [T, K]`` float32."""
    g = torch.Generator().manual_seed(seed * 1000 + rank)
    if integer:
        x = torch.randint(-8, 9, (tokens, h), generator=g).to(dtype)
    else:
        x = torch.randn((tokens, h), generator=g).to(dtype)
    idx = routing.random_topk(tokens, k, e, generator=g, drop=drop)
    if tokens:
        idx[0] = -1                       # a token that chose no expert at all
    w = torch.rand((tokens, k), generator=g).to(torch.float32)
    return x, idx, w


def expert_output(x_rows: torch.Tensor, local_expert: torch.Tensor, rank: int) -> torch.Tensor:
    """A stand-in expert: ``(e + 1) * x + rank`` per row, in x's dtype."""
    f = (local_expert.to(torch.float32) + 1).unsqueeze(1)
    return (x_rows.to(torch.float32) * f + rank).to(x_rows.dtype)


def normal_rows(d, rank: int, dtype) -> torch.Tensor:
    """The caller's normal-mode ``y`` for a dispatch result ``d``: its experts' outputs,
    weighted, summed in k order."""
    rows, ks = (d.topk_idx >= 0).nonzero(as_tuple=True)
    xr = d.dequantized(dtype)[rows] if d.scales is not None else d.x[rows]
    pairs = expert_output(xr, d.topk_idx[rows, ks], rank)
    return weighted_rows(d.x.shape[0], ks, rows, d.topk_weights[rows, ks], pairs,
                         d.topk_idx.shape[1], dtype)


def reference_combined(ref: list[dict], tokens: list[int], dtype, fp8: bool = False,
                       host_of: list[int] | None = None) -> list[torch.Tensor]:
    """Every source rank's combined output when each rank runs the stand-in experts on its
    rows of the reference dispatch ``ref`` (:func:`.reference.dispatch`) and weights them:
    the caller's rows are a function of the dispatched rows, so they are rebuilt from the
    reference (an engine that moved a wrong row fails the dispatch comparison first)."""
    from . import reference as R
    from .fp8 import dequantize
    ys = []
    for q, d in enumerate(ref):
        xq = dequantize(d["x"], d["scales"], dtype) if fp8 else d["x"]
        ys.append(R.weighted(lambda i, j, xq=xq, d=d, q=q: expert_output(
            xq[i:i + 1], d["topk_idx"][i, j:j + 1], q)[0], d, dtype))
    return R.combine(ys, ref, list(tokens), dtype, host_of=host_of)

"""Slow, obviously correct collectives over lists of per-rank tensors (rank order).

Tests and ``bench --check`` compare the fast paths with these. Reductions accumulate in rank
order in the tensor's dtype; with data whose sums are exact (small integers) any order gives the
same bits, so comparisons are exact.
"""

from __future__ import annotations

from typing import Sequence

import torch

from .types import ReduceOp

_FN = {ReduceOp.SUM: torch.add, ReduceOp.AVG: torch.add, ReduceOp.PROD: torch.mul,
       ReduceOp.MIN: torch.minimum, ReduceOp.MAX: torch.maximum}


def reduced(inputs: Sequence[torch.Tensor], op="sum") -> torch.Tensor:
    op = ReduceOp.parse(op)
    acc = inputs[0].clone()
    for x in inputs[1:]:
        acc = _FN[op](acc, x)
    if op is ReduceOp.AVG:
        acc = acc / len(inputs)
    return acc.to(inputs[0].dtype)


def rank_order_reduced(inputs: Sequence[torch.Tensor], op="sum") -> torch.Tensor:
    """What deterministic mode promises: combine the ranks' tensors in rank order 0..W-1 in
    float32 (float64 and integers in their own type; fp16/bf16 converted to float32), apply
    avg's division, and round to the input dtype once at the end."""
    op = ReduceOp.parse(op)
    dtype = inputs[0].dtype
    wide = torch.float32 if dtype in (torch.float16, torch.bfloat16) else dtype
    acc = inputs[0].to(wide).clone()
    for x in inputs[1:]:
        acc = _FN[op](acc, x.to(wide))
    if op is ReduceOp.AVG:
        acc = acc / len(inputs)
    return acc.to(dtype)


def all_reduce(inputs, op="sum"):
    r = reduced(inputs, op)
    return [r.clone() for _ in inputs]


def all_gather(inputs):
    g = torch.cat([x.reshape(-1, *x.shape[1:]) if x.dim() else x.reshape(1) for x in inputs])
    return [g.clone() for _ in inputs]


def reduce_scatter(inputs, op="sum"):
    return list(reduced(inputs, op).chunk(len(inputs)))


def broadcast(inputs, root=0):
    return [inputs[root].clone() for _ in inputs]


def reduce(inputs, root=0, op="sum"):
    out = [x.clone() for x in inputs]
    out[root] = reduced(inputs, op)
    return out


def all_to_all(inputs):
    w = len(inputs)
    blocks = [x.chunk(w) for x in inputs]
    return [torch.cat([blocks[j][r] for j in range(w)]) for r in range(w)]


def all_to_all_v(inputs, send_counts: Sequence[Sequence[int]]):
    """``send_counts[i][j]`` rows go from rank i to rank j."""
    w = len(inputs)
    pieces = [list(torch.split(x, list(send_counts[i]))) for i, x in enumerate(inputs)]
    return [torch.cat([pieces[j][r] for j in range(w)]) for r in range(w)]

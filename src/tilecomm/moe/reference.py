"""Slow, obviously correct MoE dispatch and combine over every rank's inputs at once.

Token by token, with Python loops; the tests compare every engine with these. Inputs are lists
indexed by rank. The arithmetic is the one :mod:`.routing` and :mod:`.dispatched` define:
combine sums float32 in the order of ``routing.combine_groups`` (one host: rank order) and
rounds once; weighting multiplies in float32 and adds the products in k order.
"""

from __future__ import annotations

import torch

from . import fp8 as fp8mod
from .routing import combine_groups


def _owner(e: int, el: int) -> int:
    return e // el


def dispatch(xs, idxs, weights, num_experts: int, fp8: bool = False) -> list[dict]:
    """Per rank ``r``: ``x, scales, src_rank, src_token, topk_idx, topk_weights,
    tokens_per_expert`` of a normal-mode dispatch."""
    w = len(xs)
    el = num_experts // w
    q = [fp8mod.quantize(x) if fp8 else (x, None) for x in xs]
    out = []
    for r in range(w):
        rows, scales, srank, stok, lidx, lw = [], [], [], [], [], []
        for s in range(w):
            for t in range(xs[s].shape[0]):
                entries = idxs[s][t].tolist()
                if not any(e >= 0 and _owner(e, el) == r for e in entries):
                    continue
                rows.append(q[s][0][t])
                if fp8:
                    scales.append(q[s][1][t])
                srank.append(s)
                stok.append(t)
                lidx.append([e - r * el if e >= 0 and _owner(e, el) == r else -1
                             for e in entries])
                lw.append([float(weights[s][t, k]) if lidx[-1][k] >= 0 else 0.0
                           for k in range(len(entries))])
        h, k = xs[0].shape[1], idxs[0].shape[1]
        dt = fp8mod.DTYPE if fp8 else xs[0].dtype
        x = torch.stack(rows) if rows else torch.zeros((0, h), dtype=dt)
        topk = torch.tensor(lidx, dtype=torch.int64).reshape(-1, k)
        tpe = torch.zeros(el, dtype=torch.int64)
        for row in lidx:
            for e in row:
                if e >= 0:
                    tpe[e] += 1
        out.append(dict(
            x=x, scales=(torch.stack(scales) if scales else
                         torch.zeros((0, h // fp8mod.BLOCK), dtype=torch.float32)) if fp8 else None,
            src_rank=torch.tensor(srank, dtype=torch.int64),
            src_token=torch.tensor(stok, dtype=torch.int64),
            topk_idx=topk, topk_weights=torch.tensor(lw, dtype=torch.float32).reshape(-1, k),
            tokens_per_expert=tpe))
    return out


def combine(ys, dispatched: list[dict], tokens: list[int], dtype: torch.dtype,
            host_of: list[int] | None = None) -> list[torch.Tensor]:
    """Per source rank ``[T_s, H]``: ``ys[r] [R_r, H]`` summed back into the tokens they came
    from, float32, in the order of ``combine_groups(host_of)``, rounded once."""
    w = len(ys)
    h = ys[0].shape[1]
    groups = combine_groups(host_of or [0] * w)
    outs = []
    for s in range(w):
        acc = [torch.zeros(h, dtype=torch.float32) for _ in range(tokens[s])]
        for group in groups:
            part = [torch.zeros(h, dtype=torch.float32) for _ in range(tokens[s])]
            for r in group:
                d = dispatched[r]
                for i in range(d["src_rank"].numel()):
                    if int(d["src_rank"][i]) == s:
                        t = int(d["src_token"][i])
                        part[t] = part[t] + ys[r][i].to(torch.float32)
            acc = [a + p for a, p in zip(acc, part)]
        outs.append(torch.stack(acc).to(dtype) if acc else torch.zeros((0, h), dtype=dtype))
    return outs


def weighted(y_of_pair, d: dict, dtype: torch.dtype) -> torch.Tensor:
    """Rows ``[R, H]`` from per-pair outputs: ``y_of_pair(row, k) -> [H]`` (this rank's expert
    output for the row's k-th entry); weights applied in float32, products added in k order."""
    n, k = d["topk_idx"].shape
    h = d["x"].shape[1]
    rows = []
    for i in range(n):
        acc = torch.zeros(h, dtype=torch.float32)
        for j in range(k):
            if int(d["topk_idx"][i, j]) >= 0:
                acc = acc + y_of_pair(i, j).to(torch.float32) * d["topk_weights"][i, j]
        rows.append(acc.to(dtype))
    return torch.stack(rows) if rows else torch.zeros((0, h), dtype=dtype)


def low_latency(d: dict, world: int, el: int, m: int) -> dict:
    """The low-latency layout of rank r's normal dispatch ``d``: ``x [El, W*m, H]`` (zeros in
    unused slots), ``count [El]``, ``slot [R, K]`` (flat index of each (row, k), -1 if none)."""
    h = d["x"].shape[1]
    x = torch.zeros((el, world * m, h), dtype=d["x"].dtype)
    fill = [[0] * world for _ in range(el)]
    n, k = d["topk_idx"].shape
    slot = torch.full((n, k), -1, dtype=torch.int64)
    for i in range(n):
        s = int(d["src_rank"][i])
        for j in range(k):
            e = int(d["topk_idx"][i, j])
            if e >= 0:
                pos = s * m + fill[e][s]
                fill[e][s] += 1
                x[e, pos] = d["x"][i]
                slot[i, j] = e * world * m + pos
    count = torch.tensor([sum(f) for f in fill], dtype=torch.int64)
    return dict(x=x, count=count, slot=slot)

"""Which token rows go where: the one definition of MoE dispatch and combine.

Every engine (the CPU executor of :mod:`.cpu`, the hosts engine of :mod:`.hosts`, the Triton
kernels of :mod:`.kernel`), the reference (:mod:`.reference`) and the simulator
(``tilecomm sim moe``) derive what moves from these functions, so they cannot disagree.

Terms. ``W`` ranks, ``E`` experts, ``El = E / W`` per rank: rank ``r`` owns experts
``[r*El, (r+1)*El)``. A source rank has ``T`` tokens and a ``[T, K]`` int64 ``topk_idx``
(-1: no expert). Token ``t`` is *sent to* rank ``r`` when any of its entries names one of
``r``'s experts; it is sent once however many of them it names.

Dispatch, on rank ``r``: one row per (source ``s``, token ``t``) sent to ``r``, ordered by
``s``, then ``t``. Source ``s``'s rows start at ``offsets[s][r] = sum_{s' < s} counts[s'][r]``.

Combine, on source ``s``: ``out[t] = sum over the ranks t was sent to, in the order of
:func:`combine_groups`, of y_r[row of (s, t)]``, accumulated in float32, rounded once. On one
host the order is plain rank order; across hosts a host's ranks are summed first (in rank
order, float32) and the host sums are then added in host order, so that one float32 partial
per (token, host) crosses the network.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


def experts_per_rank(num_experts: int, world: int) -> int:
    if num_experts <= 0 or num_experts % world:
        raise ValueError(f"num_experts ({num_experts}) must be a positive multiple of the "
                         f"world size ({world}): each rank owns num_experts / world_size")
    return num_experts // world


def check_topk(topk_idx: torch.Tensor, num_experts: int) -> tuple[int, str] | None:
    """The first bad token of ``topk_idx [T, K]``: ``(t, why)`` or None. Entries must be -1
    or in ``[0, E)``, and no expert may repeat within a row."""
    if topk_idx.numel() == 0:
        return None
    bad = (topk_idx < -1) | (topk_idx >= num_experts)
    if bool(bad.any()):
        t = int(bad.any(1).nonzero()[0, 0])
        return t, (f"token {t}: topk_idx[{t}] = {topk_idx[t].tolist()} has an expert outside "
                   f"[0, {num_experts}) (and not -1)")
    srt = topk_idx.sort(dim=1).values
    rep = (srt[:, 1:] == srt[:, :-1]) & (srt[:, 1:] >= 0)
    if bool(rep.any()):
        t = int(rep.any(1).nonzero()[0, 0])
        return t, f"token {t}: topk_idx[{t}] = {topk_idx[t].tolist()} names an expert twice"
    return None


def dest_mask(topk_idx: torch.Tensor, el: int, world: int) -> torch.Tensor:
    """``[T, W]`` bool: token ``t`` is sent to rank ``r``."""
    t = topk_idx.shape[0]
    mask = torch.zeros((t, world + 1), dtype=torch.bool, device=topk_idx.device)
    owner = torch.where(topk_idx >= 0, topk_idx // el, world)        # -1 -> the dummy column
    mask.scatter_(1, owner, True)
    return mask[:, :world]


def send_counts(mask: torch.Tensor) -> list[int]:
    """Rows this source sends to each rank (``[W]``)."""
    return mask.sum(0).tolist()


def offsets(counts: list[list[int]]) -> list[list[int]]:
    """``offsets[s][r]``: first row of source ``s`` in rank ``r``'s dispatch output, from
    ``counts[s][r]`` (rows ``s`` sends to ``r``)."""
    w = len(counts)
    off = [[0] * w for _ in range(w)]
    for r in range(w):
        acc = 0
        for s in range(w):
            off[s][r] = acc
            acc += counts[s][r]
    return off


def local_topk(topk_idx: torch.Tensor, topk_weights: torch.Tensor, rank: int, el: int
               ) -> tuple[torch.Tensor, torch.Tensor]:
    """The receiver's view of source rows ``[n, K]``: rank ``rank``'s experts as local indices
    ``0..el-1`` and -1 elsewhere; weights float32, 0 where the index is -1."""
    lo = rank * el
    mine = (topk_idx >= lo) & (topk_idx < lo + el)
    idx = torch.where(mine, topk_idx - lo, torch.full_like(topk_idx, -1))
    w = torch.where(mine, topk_weights.to(torch.float32), torch.zeros((), dtype=torch.float32))
    return idx, w


def tokens_per_expert(local_idx: torch.Tensor, el: int) -> torch.Tensor:
    """``[el]`` int64: (row, k) pairs per local expert."""
    flat = local_idx[local_idx >= 0]
    return torch.bincount(flat, minlength=el).to(torch.int64)


def combine_groups(host_of: list[int]) -> list[list[int]]:
    """The order combine sums destination ranks in: ranks grouped by host (hosts in order of
    their lowest rank), each group in rank order. One host: ``[[0, 1, ..., W-1]]``."""
    groups: dict[int, list[int]] = {}
    for r, h in enumerate(host_of):
        groups.setdefault(h, []).append(r)
    return sorted(groups.values(), key=lambda g: g[0])


@dataclass(frozen=True)
class Traffic:
    """What one dispatch moves (the simulator's input; combine moves the same rows back).

    ``counts[s][r]``: rows source ``s`` sends to rank ``r`` (``s == r``: kept local);
    ``host_rows[s][h]``: rows source ``s`` sends to host ``h`` (a token sent to several ranks
    of one host crosses the network once)."""
    counts: list[list[int]]
    host_rows: list[list[int]]


def traffic(topk_by_rank: list[torch.Tensor], num_experts: int,
            host_of: list[int] | None = None) -> Traffic:
    """Row counts of one dispatch from every rank's ``topk_idx``."""
    w = len(topk_by_rank)
    el = experts_per_rank(num_experts, w)
    host_of = host_of or [0] * w
    hosts = sorted(set(host_of))
    counts, host_rows = [], []
    for idx in topk_by_rank:
        m = dest_mask(idx, el, w)
        counts.append(send_counts(m))
        host_rows.append([int(m[:, [r for r in range(w) if host_of[r] == h]].any(1).sum())
                          for h in hosts])
    return Traffic(counts, host_rows)


def random_topk(tokens: int, topk: int, num_experts: int, generator: torch.Generator | None = None,
                drop: float = 0.0) -> torch.Tensor:
    """``[tokens, topk]`` int64: distinct experts per token, uniform (what a balanced router
    gives; the bench and the simulator use it). ``drop``: fraction of entries set to -1."""
    if topk > num_experts:
        raise ValueError(f"topk ({topk}) is larger than num_experts ({num_experts})")
    scores = torch.rand((tokens, num_experts), generator=generator)
    idx = scores.topk(topk, dim=1).indices.to(torch.int64)
    if drop > 0:
        off = torch.rand((tokens, topk), generator=generator) < drop
        idx = torch.where(off, torch.full_like(idx, -1), idx)
    return idx

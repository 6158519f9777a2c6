"""What dispatch returns, and the layouts combine accepts back.

``Dispatched`` (normal mode) holds one row per (source rank, source token) sent to this rank,
ordered by source rank then token (:mod:`.routing`). ``d.grouped()`` reorders the (row, k)
pairs expert-major for a grouped GEMM. Low-latency mode holds ``[El, W*M, H]`` slots per local
expert instead. Whatever the layout, combine first reduces the caller's outputs to one row per
received row (:func:`weighted_rows`: the weighted sum over the row's local experts in k order,
float32, rounded once to the dtype) and then moves those rows back; normal mode's ``y`` already
is that.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from . import routing


@dataclass
class Layout:
    """Where this rank's rows came from and where its tokens went (one dispatch).

    ``counts[s][r]``: rows source ``s`` sent to rank ``r``; ``send_tokens[r]``: this rank's
    token indices sent to ``r`` (int64, increasing); ``tokens[s]``: tokens of rank ``s``."""
    rank: int
    world: int
    el: int
    hidden: int
    dtype: torch.dtype
    counts: list[list[int]]
    tokens: list[int]
    send_tokens: list[torch.Tensor]
    call: int
    #: the combine order of :func:`routing.combine_groups`
    groups: list[list[int]]
    #: engine-private state the combine needs (e.g. the hosts engine's forwarding lists)
    extra: dict = field(default_factory=dict)
    #: this rank's ``topk_idx``/``topk_weights`` as dispatched (the backward of combine
    #: dispatches its gradient the same way)
    sent_idx: torch.Tensor | None = None
    sent_weights: torch.Tensor | None = None

    @property
    def rows(self) -> int:
        """Rows this rank received."""
        return self.rows_of(self.rank)

    def rows_of(self, r: int) -> int:
        """Rows rank ``r`` received."""
        return sum(self.counts[s][r] for s in range(self.world))

    def offsets_at(self, r: int) -> list[int]:
        """``[W]``: first row of each source in rank ``r``'s rows (routing.offsets)."""
        return [row[r] for row in routing.offsets(self.counts)]


@dataclass
class Dispatched:
    """Result of :meth:`ExpertParallel.dispatch`.

    normal mode (``R`` received rows): ``x [R, H]`` (float8_e4m3fn with ``scales
    [R, H/128]`` float32 under fp8), ``src_rank [R]``, ``src_token [R]`` int64, ``topk_idx
    [R, K]`` int64 (this rank's experts as 0..El-1, others -1), ``topk_weights [R, K]`` float32
    (0 where -1), ``tokens_per_expert [El]`` int64.

    low-latency mode: ``x [El, W*M, H]`` (source ``s``'s rows for expert ``e`` at
    ``x[e, s*M : s*M + n]``, in token order; other slots are not written), ``count [El]`` int64
    valid rows per expert, ``src_rank``/``src_token [El, W*M]`` (-1 in unused slots), ``scales
    [El, W*M, H/128]`` under fp8; ``topk_idx``/``topk_weights`` are the per-row ones, as in
    normal mode, and ``slot [R, K]`` says where (flat index into ``El * W*M``) row r's k-th
    entry sits (-1: not this rank's expert). On the kernel engine (no host round trip: NOTE
    [low latency on the device]) ``topk_idx``, ``topk_weights`` and ``slot`` are None (their
    number of rows is data) and ``x``/``scales`` are views of the receive buffer, valid until
    this rank's next low-latency dispatch.
    """
    x: torch.Tensor
    src_rank: torch.Tensor
    src_token: torch.Tensor
    topk_idx: torch.Tensor
    topk_weights: torch.Tensor
    tokens_per_expert: torch.Tensor
    layout: Layout
    mode: str = "normal"
    scales: torch.Tensor | None = None
    count: torch.Tensor | None = None
    slot: torch.Tensor | None = None
    max_tokens_per_rank: int = 0

    def dequantized(self, dtype: torch.dtype = torch.bfloat16) -> torch.Tensor:
        """``x`` as ``dtype`` (fp8 rows times their scales; otherwise a cast)."""
        if self.scales is None:
            return self.x.to(dtype)
        from .fp8 import dequantize
        return dequantize(self.x, self.scales, dtype)

    def grouped(self) -> "Grouped":
        """The (row, k) pairs expert-major (normal mode): see :class:`Grouped`."""
        if self.mode != "normal":
            raise ValueError("grouped() is for normal-mode dispatches (low-latency ones are "
                             "already expert-major)")
        idx = self.topk_idx
        rows, ks = (idx >= 0).nonzero(as_tuple=True)
        experts = idx[rows, ks]
        # stable sort by expert keeps (row, k) order within an expert: rows by source, token
        order = torch.sort(experts, stable=True).indices
        rows, ks, experts = rows[order], ks[order], experts[order]
        offsets = torch.zeros(self.layout.el + 1, dtype=torch.int64)
        offsets[1:] = torch.cumsum(self.tokens_per_expert, 0)
        scales = None if self.scales is None else self.scales[rows]
        return Grouped(x=self.x[rows], offsets=offsets,
                       tokens_per_expert=self.tokens_per_expert, row=rows, k=ks,
                       weights=self.topk_weights[rows, ks], scales=scales, dispatched=self)


@dataclass
class Grouped:
    """Expert-major layout of a normal dispatch, for a grouped GEMM.

    ``x [N, H]`` (N = sum of tokens_per_expert): expert e's rows at ``x[offsets[e]:offsets[e+1]]``,
    in the order of the dispatch rows; ``row [N]``, ``k [N]`` int64: the dispatch row and topk
    column of each; ``weights [N]`` float32. ``combine(y, grouped)`` takes ``y [N, H]``, the
    experts' *unweighted* outputs."""
    x: torch.Tensor
    offsets: torch.Tensor
    tokens_per_expert: torch.Tensor
    row: torch.Tensor
    k: torch.Tensor
    weights: torch.Tensor
    scales: torch.Tensor | None
    dispatched: Dispatched


def weighted_rows(rows: int, k_of: torch.Tensor, row_of: torch.Tensor, weights: torch.Tensor,
                  y: torch.Tensor, topk: int, dtype: torch.dtype) -> torch.Tensor:
    """``out[r] = round(sum over the pairs of row r, in k order, of w * y_pair)`` ``[rows, H]``.

    ``y [N, H]`` pair outputs with ``row_of``/``k_of``/``weights [N]``. float32 throughout
    (each product rounded to float32, then added: no fused multiply-add), one rounding to
    ``dtype``; a row without pairs is 0."""
    acc = torch.zeros((rows, y.shape[-1]), dtype=torch.float32, device=y.device)
    for k in range(topk):
        sel = (k_of == k).nonzero(as_tuple=True)[0]
        if sel.numel():
            prod = y[sel].to(torch.float32) * weights[sel].to(torch.float32).unsqueeze(1)
            acc.index_add_(0, row_of[sel], prod)       # one pair per row per k: no reordering
    return acc.to(dtype)

"""Autograd for dispatch and combine: each one's backward is the other one's move.

dispatch (``x [T, H]``, ``topk_weights [T, K]`` -> ``d.x [R, H]``, ``d.topk_weights [R, K]``)
    every received row is a copy of a source token, so the gradient of ``x[t]`` is the sum of
    the gradients of its copies on the ranks it went to: a combine of ``grad d.x`` (float32
    sum in the combine order, one rounding to the dtype). The weights' gradient is a combine
    of ``grad d.topk_weights`` as ``[R, K]`` float32 rows, masked to the entries this rank
    owns (the others were zeroed in the forward); each ``(t, k)`` then has one nonzero term,
    so it arrives exact.
combine (``rows [R, H]`` -> ``out [T, H]``)
    ``out[t]`` is the sum of the rows sent back for ``t``, so each row's gradient is
    ``grad out[t]`` of its source token: a dispatch of ``grad out`` with the forward's
    routing (rows arrive in the same order).

The grouped and low-latency layouts reach combine through ``weighted_rows`` (plain torch
ops), so their gradients flow through it into these two. Low-latency and fp8 dispatches do
not record gradients (the checks refuse them on every rank).

Backward is collective like the forward: every rank must backpropagate through every
dispatch and combine it recorded, in the same order (as with DistributedDataParallel); the
ranks agree in the forward that all or none record (else CommMismatch).
"""

from __future__ import annotations

import dataclasses

import torch

from . import checks, routing


def _combine_move(ep, rows: torch.Tensor, layout, width: int, dtype: torch.dtype
                  ) -> torch.Tensor:
    """Move ``rows [layout.rows, width]`` back to this rank's tokens: ``[T, width]``."""
    mine = checks.describe("combine", "normal", 0, -1, e=ep.num_experts, h=width,
                           k=layout.sent_idx.shape[1], dtype=dtype, fp8=False, m=0,
                           t=layout.tokens[layout.rank], ready=False, call=layout.call,
                           per_rank=[])
    return ep.move_combine(width, dtype, mine, "", rows.to(dtype).contiguous(), layout,
                       rows.device)


class _Dispatch(torch.autograd.Function):
    @staticmethod
    def forward(ctx, ep, box: dict, x, topk_weights):
        d = ep.move_dispatch(box["mine"], box["detail"], x, box["idx"], topk_weights,
                         box["mask"], False)
        box["d"] = d
        ctx.ep, ctx.layout = ep, d.layout
        ctx.owned = d.topk_idx >= 0
        ctx.shapes = (x.dtype, topk_weights.shape[1])
        return d.x, d.topk_weights

    @staticmethod
    def backward(ctx, grad_x, grad_w):
        ep, layout = ctx.ep, ctx.layout
        rows, k = layout.rows, ctx.shapes[1]
        dev = ctx.owned.device
        if grad_x is None:             # the peers still run this combine: send zeros
            grad_x = torch.zeros((rows, ep.hidden), dtype=ep.dtype, device=dev)
        if grad_w is None:
            grad_w = torch.zeros((rows, k), dtype=torch.float32, device=dev)
        gx = _combine_move(ep, grad_x, layout, ep.hidden, ep.dtype)
        gw = _combine_move(ep, grad_w.to(torch.float32) * ctx.owned, layout, k, torch.float32)
        return None, None, gx, gw


class _Combine(torch.autograd.Function):
    @staticmethod
    def forward(ctx, ep, box: dict, rows):
        ctx.ep, ctx.layout = ep, box["layout"]
        return ep.move_combine(ep.hidden, ep.dtype, box["mine"], box["detail"], rows,
                           box["layout"], rows.device)

    @staticmethod
    def backward(ctx, grad_out):
        ep, lay = ctx.ep, ctx.layout
        call = ep.next_call()
        mask = routing.dest_mask(lay.sent_idx, ep.el, ep.world)
        mine = checks.describe("dispatch", "normal", 0, -1, e=ep.num_experts, h=ep.hidden,
                               k=lay.sent_idx.shape[1], dtype=ep.dtype, fp8=False, m=0,
                               t=lay.tokens[lay.rank], ready=False, call=call,
                               per_rank=routing.send_counts(mask))
        g = grad_out.to(ep.dtype).contiguous()
        mv = ep.engine_for(g.device).dispatch(ep, mine, "", g, None, lay.sent_idx,
                                          lay.sent_weights)
        return None, None, mv.x


def dispatch_recorded(ep, mine, detail, x, topk_idx, topk_weights, mask):
    """``ep.dispatch`` in normal mode with gradients to ``x`` and ``topk_weights``."""
    box = {"mine": mine, "detail": detail, "idx": topk_idx, "mask": mask}
    dx, dw = _Dispatch.apply(ep, box, x, topk_weights)
    return dataclasses.replace(box["d"], x=dx, topk_weights=dw)


def combine_recorded(ep, mine, detail, rows, layout):
    """``ep.combine`` with the gradient flowing back to ``rows``."""
    return _Combine.apply(ep, {"mine": mine, "detail": detail, "layout": layout}, rows)

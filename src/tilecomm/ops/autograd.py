"""Autograd for the fused ops: each one's backward is the other one.

Column-parallel ``c = all_gather(a) @ b`` (``a_shard [m, K]``, ``b [K, N_r]``):
``grad_a_shard`` = this rank's rows of ``sum_r grad_c_r @ b_r^T`` =
``matmul_reduce_scatter(grad_c, b^T)``; ``grad_b = all_gather(a)^T @ grad_c`` (the gathered A
is kept from the forward).

Row-parallel ``y = rows of sum_r a_r @ b_r`` (``a [W*m, K_r]``, ``b [K_r, N]``):
``grad_a = all_gather(grad_y) @ b^T`` = ``all_gather_matmul(grad_y, b^T)``, and
``grad_b = a^T @ all_gather(grad_y)`` (the gathered gradient comes back with it).

Every rank must call backward (the backward ops are collective, like the forward).
"""

from __future__ import annotations

import torch

from .engines import engine_for


class AllGatherMatmul(torch.autograd.Function):
    @staticmethod
    def forward(ctx, a_shard, b, comm, copy="kernel"):
        c, gathered = engine_for(comm, a_shard).all_gather_matmul(
            comm, a_shard.detach(), b.detach(), return_gathered=True, copy=copy)
        ctx.comm = comm
        ctx.save_for_backward(gathered, b)
        ctx.mark_non_differentiable(gathered)
        return c, gathered

    @staticmethod
    def backward(ctx, grad_c, _grad_gathered):
        gathered, b = ctx.saved_tensors
        grad_c = grad_c.contiguous()
        grad_a = grad_b = None
        if ctx.needs_input_grad[0]:
            grad_a = engine_for(ctx.comm, grad_c).matmul_reduce_scatter(ctx.comm, grad_c, b.t())
        if ctx.needs_input_grad[1]:
            grad_b = (gathered.float().t() @ grad_c.float()).to(b.dtype)
        return grad_a, grad_b, None, None


class MatmulReduceScatter(torch.autograd.Function):
    @staticmethod
    def forward(ctx, a, b, comm):
        ctx.comm = comm
        ctx.save_for_backward(a, b)
        return engine_for(comm, a).matmul_reduce_scatter(comm, a.detach(), b.detach())

    @staticmethod
    def backward(ctx, grad_y):
        a, b = ctx.saved_tensors
        grad_y = grad_y.contiguous()
        grad_a, grad_full = engine_for(ctx.comm, grad_y).all_gather_matmul(
            ctx.comm, grad_y, b.t(), return_gathered=True)
        grad_b = (a.float().t() @ grad_full.float()).to(b.dtype) \
            if ctx.needs_input_grad[1] else None
        return (grad_a if ctx.needs_input_grad[0] else None), grad_b, None

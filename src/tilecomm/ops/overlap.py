"""The public fused ops: argument handling, engine choice, autograd (see the package doc)."""

from __future__ import annotations

import torch

from .engines import engine_for


def _wants_grad(*ts) -> bool:
    return torch.is_grad_enabled() and any(isinstance(t, torch.Tensor) and t.requires_grad
                                           for t in ts)


def all_gather_matmul(a_shard: torch.Tensor, b: torch.Tensor, comm, *,
                      return_gathered: bool = False, out: torch.Tensor | None = None,
                      copy: str = "kernel"):
    """``all_gather(a_shard) @ b`` without waiting for the whole gather (collective).

    ``a_shard [m, K]`` is this rank's rows of A (every rank the same ``m``), ``b [K, N]``; the
    result is ``[W*m, N]`` in the inputs' dtype (float32, bfloat16 or float16; float32
    accumulation, rounded once). ``return_gathered=True`` returns ``(c, gathered_a)`` with
    ``gathered_a [W*m, K]``. ``out`` (``[W*m, N]``, same dtype and device) receives ``c``
    (its contents are unspecified if the call raises). Differentiable in ``a_shard`` and
    ``b`` (the backward of ``a_shard`` is a matmul_reduce_scatter); ``out`` is refused then.

    ``copy`` (kernel engine: CUDA tensors, or CPU tensors with ``use_cpu_kernels("triton")``):
    who copies the peers' chunks, ``"kernel"`` (the persistent GEMM's own gets, one row block
    at a time) or ``"stream"`` (the copy engine on a side stream, one cudaMemcpyAsync per
    chunk, the GEMM split per chunk behind stream waits; in the interpreter, the same steps
    one after the other, the copies made by the CPU). Same results either way: on one H200
    (2 ranks sharing it) the GPU check's all_gather_matmul cases of both variants passed
    (docs/benchmarks.md, "GPU"). Which is faster on a GPU is for ``scripts/gpu_check.py`` to
    say: neither has been timed on one. The CPU engine accepts both and runs the same code
    (it copies nothing).

    Ranks that disagree on the dtype, ``m``, ``K``, ``N`` or ``return_gathered`` raise
    :class:`~tilecomm.CommMismatch` on every rank; arguments that do not fit raise
    ``ValueError``/``TypeError`` naming the dimension on the rank that passed them and saying
    which rank it was on the others.
    """
    if _wants_grad(a_shard, b):
        from .autograd import AllGatherMatmul
        if out is not None:
            raise ValueError("all_gather_matmul: out= is not supported when a gradient is "
                             "required (autograd needs a fresh output)")
        c, g = AllGatherMatmul.apply(a_shard, b, comm, copy)
        return (c, g) if return_gathered else c
    return engine_for(comm, a_shard).all_gather_matmul(comm, a_shard, b, out=out,
                                                    return_gathered=bool(return_gathered),
                                                    copy=copy)


def matmul_reduce_scatter(a: torch.Tensor, b: torch.Tensor, comm, *,
                          out: torch.Tensor | None = None) -> torch.Tensor:
    """This rank's rows of ``sum_r a_r @ b_r`` without waiting for the whole product.

    ``a [W*m, K_r]`` and ``b [K_r, N]`` (this rank's slice of the inner dimension; ``K_r`` may
    differ between ranks, ``W*m`` and ``N`` may not). Returns ``[m, N]``: rows
    ``[rank*m, (rank+1)*m)`` of the sum, the float32 partial products added in rank order
    0..W-1 and rounded once to the inputs' dtype (deterministic). ``out`` (``[m, N]``)
    receives it. Differentiable (the backward of ``a`` is an all_gather_matmul). Errors as
    :func:`all_gather_matmul`; ``M`` not a multiple of the world size is a ``ValueError``.
    """
    if _wants_grad(a, b):
        from .autograd import MatmulReduceScatter
        if out is not None:
            raise ValueError("matmul_reduce_scatter: out= is not supported when a gradient is "
                             "required (autograd needs a fresh output)")
        return MatmulReduceScatter.apply(a, b, comm)
    return engine_for(comm, a).matmul_reduce_scatter(comm, a, b, out=out)

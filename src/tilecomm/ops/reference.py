"""The slow, obviously correct definitions of the fused ops; every engine is tested against them.

Arithmetic. Every product is one ``torch.matmul`` per chunk in the input dtype
(:func:`chunk_gemm`): torch's GEMMs accumulate 16-bit inputs in float32 and round the output
once. all_gather_matmul: that is the result. matmul_reduce_scatter: each rank's partial
product ``a_s[rows of c] @ b_s`` is such a GEMM, so it is **rounded to the input dtype** (as
the unfused ``torch.matmul`` then ``reduce_scatter`` computes it); the partials are converted
to float32 and added in rank order 0..W-1 (``((p0 + p1) + p2) + ...``), rounded to the input
dtype once at the end (what tilecomm's ``reduce_scatter`` does with 16-bit inputs, and
:func:`tilecomm.reference.rank_order_reduced`). So the fused op returns the same bits as the
unfused ``comm.reduce_scatter(torch.matmul(a, b))`` wherever the per-chunk GEMM equals the
full GEMM's rows, and moves 16-bit partials (half the bytes of float32 ones). Why not float32
partials: they cost twice the bytes on the wire, and on CPUs with 16-bit matrix units a float32
GEMM is several times slower than a bf16 one (measured: 3x slower than unfused on this
machine's bf16 runs, docs/benchmarks.md); the extra precision is one bf16 rounding per partial,
which the unfused baseline has too. For float32 inputs nothing changes.

What "the same bits" can mean for a GEMM: two GEMM implementations (a Triton kernel's
``tl.dot`` tiles and torch's BLAS, or BLAS on different shapes) add the K products in different
orders, so their float32 results differ in the last bits. The references therefore compute each
product **chunk by chunk, on the shapes the engines use**: rank ``s``'s rows ``[s*m, (s+1)*m)``
times ``b`` (all_gather_matmul) and rank ``s``'s rows for owner ``c`` times ``b_s``
(matmul_reduce_scatter), one ``torch.matmul`` each. The CPU engine calls the same op on the
same shapes (in the same process, same thread count), so it must match these bits exactly;
the Triton kernels are compared with a tolerance, and their rank-order reduction is checked
bit for bit on data whose partial products are exact in any GEMM (see tests/ops).
"""

from __future__ import annotations

from typing import Sequence

import torch


def chunk_gemm(a_rows: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """``a_rows @ b`` in the inputs' dtype (``[m, K] x [K, N] -> [m, N]``): the one GEMM call
    the references and the CPU engine make per chunk. (Not via float32: on CPUs
    with 16-bit matrix units a bf16 GEMM is several times faster than a float32 one.)"""
    return torch.matmul(a_rows, b)


def all_gather_matmul_reference(shards: Sequence[torch.Tensor], b: torch.Tensor
                                ) -> tuple[torch.Tensor, torch.Tensor]:
    """``(all_gather(a) @ b, all_gather(a))`` from every rank's ``[m, K]`` shard (rank order)
    and ``b [K, N]``: ``[W*m, N]`` and ``[W*m, K]`` in the shards' dtype."""
    out = torch.cat([chunk_gemm(s, b) for s in shards])
    return out, torch.cat(list(shards))


def matmul_reduce_scatter_reference(a: Sequence[torch.Tensor], b: Sequence[torch.Tensor]
                                    ) -> list[torch.Tensor]:
    """Every rank's output of ``matmul_reduce_scatter`` from every rank's ``a_s [W*m, K_s]``
    and ``b_s [K_s, N]``: rank ``c`` gets ``round(sum_s a_s[c*m:(c+1)*m] @ b_s)`` ``[m, N]``,
    the partials (:func:`chunk_gemm`, input dtype) added in float32 in rank order, rounded once
    to the input dtype."""
    world = len(a)
    m = a[0].shape[0] // world
    outs = []
    for c in range(world):
        acc = None
        for s in range(world):
            p = chunk_gemm(a[s][c * m:(c + 1) * m], b[s]).float()
            acc = p if acc is None else acc + p
        outs.append(acc.to(a[0].dtype))
    return outs

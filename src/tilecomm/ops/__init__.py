"""Fused compute-communication ops for tensor and sequence parallelism.

``all_gather_matmul(a_shard, b, comm)``: ``a_shard [m, K]`` (this rank's rows), ``b [K, N]``
-> ``[W*m, N]`` == ``all_gather(a) @ b``.
``matmul_reduce_scatter(a, b, comm)``: ``a [W*m, K_r]``, ``b [K_r, N]`` (this rank's slice of
K) -> ``[m, N]``, this rank's rows of ``sum_r a_r @ b_r``.

Engines (picked by the tensors' device, never by a backend's name): CPU tensors run the
shared-memory engine (:mod:`.cpu`), or the Triton kernels in the interpreter when the
communicator runs CPU collectives on kernels (``comm.use_cpu_kernels("triton")``,
TILECOMM_CPU_KERNELS=triton); CUDA tensors run the Triton kernels (:mod:`.kernel`).
Arithmetic and what is exact: :mod:`.reference`. Autograd: :mod:`.autograd`.
"""

from .overlap import all_gather_matmul, matmul_reduce_scatter
from .reference import all_gather_matmul_reference, matmul_reduce_scatter_reference

__all__ = ["all_gather_matmul", "matmul_reduce_scatter", "all_gather_matmul_reference",
           "matmul_reduce_scatter_reference"]

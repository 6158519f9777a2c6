"""GEMM and flash-attention rooflines: the time of one matmul from its shape.

Units: dimensions in elements, FLOPs counted 2 per multiply-add, rates in FLOP/s, HBM in
bytes/s, times in seconds.

NOTE [GEMM efficiency follows the shape]
    ``[M, K] x [K, N]`` runs at ``eff = E x q(M) q(N) k(K)`` of the dtype's dense peak:

    * ``q(d) = d / (d + TILE/2)``: tile quantization. cuBLAS/CUTLASS cover the output with
      128 x 128 (or larger) tiles; the last tile along a dimension is on average half empty
      (NVIDIA, "Matrix Multiplication Background User's Guide", tile quantization).
    * ``k(K) = K / (K + 2 KSTEP)``: each output tile's main loop runs K/64 steps of 64, plus
      about two steps of pipeline fill and epilogue that do no math.
    * ``E = MAMF / (q(Mb) q(Nb) k(Kb)) x derate``: the curve gives the published maximum
      achievable matmul fraction (``GPU.mamf_bf16`` / ``mamf_fp8``) at its published best shape
      ``(Mb, Nb, Kb)``; ``derate`` is the fraction of that a training step's GEMMs sustain
      (clocks under a whole node's power, launch gaps, the unmodeled small kernels). It is the
      one fitted number of the compute side (``tilecomm.workloads.validation``, fitting set
      only) and is capped so that eff <= 1.

    A GEMM takes ``max(FLOPs / (peak x eff), bytes / (HBM x HBM_EFF))``: few rows (a routed
    expert's tokens, a weight gradient reduced over few tokens) make it HBM-bound, reading its
    weights. Wave quantization (fewer output tiles than SMs) is not modeled: cuBLAS splits K
    for such shapes.

NOTE [flash attention]
    Causal attention's FLOPs run at ``attn_eff x derate x s / (s + 512) x h(d)`` of the BF16
    peak (``GPU.attn_eff``: the published kernel's rate at long sequences; ``derate`` as for
    GEMMs), ``s`` the key length, ``h(d) = min(1, d / (d + 32) / 0.8)`` for head dim ``d``: the
    FlashAttention-3 forward curve (causal, d = 128: 0.45 of its 16K rate at 512 tokens, 0.85 at
    2K, 0.98 at 8K) and its lower rate at d = 64. The backward recomputes the scores: 2.5x the
    forward FLOPs (5 matmuls against 2).
"""

from __future__ import annotations

from dataclasses import dataclass

from ..topology.gpus import GPU, HBM_EFF

TILE = 128          # output tile edge (elements) of cuBLAS/CUTLASS tensor-core GEMMs
KSTEP = 64          # K elements per main-loop step
ATTN_S0 = 512       # key length (tokens) at which flash attention runs at half its long rate
ATTN_BWD = 2.5      # flash attention backward FLOPs / forward FLOPs
# Fraction of the published MAMF that a training step's kernels sustain: fitted on the fitting
# set only (`python -m tilecomm.workloads.validation --fit`; tests/workloads check it).
DERATE = 0.742


def q(d: float) -> float:
    """Tile-quantization factor of an M or N dimension of ``d`` elements."""
    return d / (d + TILE / 2)


def k_fill(d: float) -> float:
    """Pipeline fill/epilogue factor of a reduction (K) dimension of ``d`` elements."""
    return d / (d + 2 * KSTEP)


def gemm_eff(m: float, n: float, k: float, gpu: GPU, dtype: str = "bf16",
             derate: float = DERATE) -> float:
    """Fraction of ``gpu``'s dense ``dtype`` peak a ``[m, k] x [k, n]`` GEMM runs at."""
    mamf = gpu.mamf_fp8 if dtype == "fp8" else gpu.mamf_bf16
    mb, nb, kb = gpu.mamf_shape
    top = mamf / (q(mb) * q(nb) * k_fill(kb))
    return min(1.0, top * derate) * q(m) * q(n) * k_fill(k)


@dataclass(frozen=True)
class GemmTime:
    """One (grouped) GEMM's time in seconds; ``hbm_bound`` when reading/writing HBM took
    longer than the math."""

    seconds: float
    flops: float
    hbm_bound: bool


def gemm_time(m: float, n: float, k: float, gpu: GPU, hbm_Bps: float, dtype: str = "bf16",
              groups: float = 1, out_bytes: float = 2.0, derate: float = DERATE) -> GemmTime:
    """Roofline time of ``groups`` GEMMs ``[m, k] x [k, n]`` (a grouped GEMM: experts).

    Inputs are 1 byte (fp8) or 2 (bf16) per element, the output ``out_bytes`` (2 for bf16
    activations; 8 for a weight gradient accumulated into fp32: read + write)."""
    if m <= 0 or n <= 0 or k <= 0 or groups <= 0:
        return GemmTime(0.0, 0.0, False)
    flops = 2.0 * m * n * k * groups
    t_math = flops / (gpu.peak(dtype) * gemm_eff(m, n, k, gpu, dtype, derate))
    e_in = 1.0 if dtype == "fp8" else 2.0
    nbytes = groups * (e_in * (m * k + k * n) + out_bytes * m * n)
    t_mem = nbytes / (hbm_Bps * HBM_EFF)
    return GemmTime(max(t_math, t_mem), flops, t_mem > t_math)


def attn_eff(seq: float, head_dim: float, gpu: GPU, derate: float = DERATE) -> float:
    """Fraction of the BF16 peak flash attention runs at (NOTE [flash attention])."""
    hd = min(1.0, head_dim / (head_dim + 32) / 0.8)
    return min(1.0, gpu.attn_eff * derate) * seq / (seq + ATTN_S0) * hd


def attn_time(flops: float, seq: float, head_dim: float, gpu: GPU,
              derate: float = DERATE) -> float:
    """Seconds for ``flops`` of causal flash attention at key length ``seq``."""
    if flops <= 0:
        return 0.0
    return flops / (gpu.peak("bf16") * attn_eff(seq, head_dim, gpu, derate))

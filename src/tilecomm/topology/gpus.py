"""Per-GPU compute peaks, HBM capacity, and the published GEMM and attention efficiencies.

Peaks are dense (no 2:4 sparsity) tensor-core rates in FLOP/s from NVIDIA datasheets; FP8 is
2x BF16 on Hopper and Blackwell (same datasheets).

Training compute (``tilecomm.workloads.gemm``) times every GEMM by its shape from ``mamf_bf16`` /
``mamf_fp8``: the maximum achievable matmul FLOP/s as a fraction of the dense peak, measured with
torch.matmul over a brute-force sweep of shapes (S. Bekman, "Machine Learning Engineering",
compute/accelerator/README.md, "Maximum Achievable Matmul FLOPS comparison table", BF16 and
FP8 tables), at the published best shape ``mamf_shape`` (M, N, K). Flash attention runs at
``attn_eff`` of the BF16 peak (forward and backward together, long sequences, head dim 128).

``efficiency`` is the older single fraction of peak that the *inference* model still uses
(``workloads/inference.py``); training no longer does.
"""

from __future__ import annotations

from dataclasses import dataclass

from .spec import SystemSpec


@dataclass(frozen=True)
class GPU:
    """One GPU type: ``bf16_flops`` and ``fp8_flops`` in FLOP/s (dense), ``hbm_bytes`` in bytes,
    ``efficiency`` the single fraction of peak the inference model uses (dimensionless),
    ``mamf_bf16`` / ``mamf_fp8`` the maximum achievable matmul fraction of the dense peak at the
    shape ``mamf_shape`` (M, N, K), ``attn_eff`` flash attention's fraction of the BF16 peak."""

    name: str
    bf16_flops: float
    fp8_flops: float | None
    hbm_bytes: float
    efficiency: float
    source: str
    mamf_bf16: float = 0.80
    mamf_fp8: float = 0.71
    mamf_shape: tuple = (2048, 2048, 13312)
    attn_eff: float = 0.53
    compute_source: str = ""

    def peak(self, dtype: str) -> float:
        """Dense peak FLOP/s for ``dtype`` ('bf16' | 'fp16' | 'fp8')."""
        if dtype in ("bf16", "fp16"):
            return self.bf16_flops
        if dtype == "fp8":
            if self.fp8_flops is None:
                raise ValueError(f"{self.name} has no FP8 tensor cores; use --dtype bf16")
            return self.fp8_flops
        raise ValueError(f"unknown dtype {dtype!r}; choose from bf16, fp16, fp8")


T, GB = 1e12, 1e9
HBM_EFF = 0.8   # fraction of datasheet HBM bandwidth a weight/KV stream reaches (stated)
# NOTE [one efficiency per GPU type]: the inference model (workloads/inference.py) runs all of
# its compute at 0.50 of peak, a stated round number. Training times each GEMM by its shape
# (NOTE [compute efficiencies] below and tilecomm.workloads.gemm).
#
# NOTE [compute efficiencies]
#   MAMF: Bekman, ml-engineering, compute/accelerator/README.md (BF16 and FP8 tables, torch
#   2.5-2.10): A100 SXM 271.2/312 = 0.869 at 1024x10240x5120; H100 SXM 794.5/989 = 0.803 at
#   2048x2048x13312 ("H200 is the same"); B200 1745/2250 = 0.776 at 1792x16128x3072; GB200
#   1822/2500 = 0.729 at 4096x9728x2048. FP8: H100 1402.6/1979 = 0.709, H200 0.734, B200
#   0.763, GB200 0.723. A800/H800 have A100/H100's SMs and clocks (only NVLink differs), so
#   they take those rows; L40S has no published MAMF here: H100's fraction is assumed.
#   Attention: FlashAttention-2 reaches 50-73% of A100's peak (Dao 2023, arXiv 2307.08691,
#   abstract); 0.60 for forward and backward together is the stated figure. FlashAttention-3 on
#   H100, causal, head dim 128, forward: 616 TFLOP/s (0.62) at 16K tokens (Shah et al. 2024,
#   arXiv 2407.08608, forward-speed figure); its backward is slower than its forward: 0.53 for
#   both together is the stated figure. Blackwell is assumed to keep Hopper's fraction (0.53;
#   not checked against a published kernel benchmark).
_MAMF = "Bekman, ml-engineering, MAMF comparison tables (BF16, FP8)"
_A100 = dict(mamf_bf16=0.869, mamf_fp8=0.0, mamf_shape=(1024, 10240, 5120), attn_eff=0.60,
             compute_source=_MAMF + "; FlashAttention-2 (Dao 2023)")
_H100 = dict(mamf_bf16=0.803, mamf_fp8=0.709, mamf_shape=(2048, 2048, 13312), attn_eff=0.53,
             compute_source=_MAMF + "; FlashAttention-3 (Shah et al. 2024)")
_H200 = dict(_H100, mamf_fp8=0.734)
_B200 = dict(mamf_bf16=0.776, mamf_fp8=0.763, mamf_shape=(1792, 16128, 3072), attn_eff=0.53,
             compute_source=_MAMF + "; attention: Hopper's fraction assumed")
_GB200 = dict(mamf_bf16=0.729, mamf_fp8=0.723, mamf_shape=(4096, 9728, 2048), attn_eff=0.53,
              compute_source=_MAMF + "; attention: Hopper's fraction assumed")
GPUS = {
    "A100": GPU("A100-SXM4-80GB", 312 * T, None, 80 * GB, 0.50,
                "NVIDIA A100 datasheet: BF16 312 TFLOPS dense, 80 GB HBM2e", **_A100),
    "A800": GPU("A800-SXM4-80GB", 312 * T, None, 80 * GB, 0.50,
                "NVIDIA A800 SXM4: A100's tensor cores (BF16 312 TFLOPS dense) and 80 GB, "
                "NVLink 400 GB/s bidirectional", **_A100),
    "H100": GPU("H100-SXM5-80GB", 989 * T, 1979 * T, 80 * GB, 0.50,
                "NVIDIA H100 datasheet (SXM): BF16 1,979 TFLOPS with sparsity = 989 dense; "
                "FP8 3,958 sparse = 1,979 dense; 80 GB HBM3", **_H100),
    "H800": GPU("H800-SXM5-80GB", 989 * T, 1979 * T, 80 * GB, 0.50,
                "NVIDIA H800 SXM: H100 SXM's tensor cores (BF16 989 dense, FP8 1,979 dense) and "
                "80 GB HBM3, NVLink cut to 400 GB/s bidirectional (DeepSeek-V3 report, sec. 3.1)",
                **_H100),
    "H200": GPU("H200-SXM-141GB", 989 * T, 1979 * T, 141 * GB, 0.50,
                "NVIDIA H200 datasheet: same tensor rates as H100 SXM; 141 GB HBM3e", **_H200),
    "B200": GPU("B200", 2250 * T, 4500 * T, 180 * GB, 0.50,
                "NVIDIA DGX B200 datasheet: 72 PFLOPS FP8 training (sparse) per 8 GPUs = 4.5 "
                "PFLOPS dense FP8, 2.25 BF16 per GPU; 1,440 GB per 8 GPUs = 180 GB", **_B200),
    "GB200": GPU("GB200", 2500 * T, 5000 * T, 186 * GB, 0.50,
                 "NVIDIA GB200 NVL72 spec: BF16 360 PFLOPS sparse per 72 GPUs = 2.5 PFLOPS "
                 "dense per GPU; 13.4 TB HBM3e per 72 GPUs = 186 GB", **_GB200),
    "L40S": GPU("L40S", 362 * T, 733 * T, 48 * GB, 0.50,
                "NVIDIA L40S datasheet: BF16 362 TFLOPS dense, FP8 733 dense, 48 GB GDDR6",
                compute_source="no published MAMF: H100's fractions assumed"),
    # Meta's Grand Teton H100 (torchtitan's benchmark cluster, benchmarks/
    # llama3_h100_202412_torchtitan.md): 96 GB HBM2e at 2.4 TB/s, run at a 500 W power limit;
    # "the actual peak TFLOPs number is between SXM and NVL" (H100 NVL: 835 dense BF16): the
    # midpoint, 912, is the stated figure. Systems name it with "H100-500W" in their gpu.
    "H100-500W": GPU("H100-HBM2e-96GB-500W", 912 * T, 1824 * T, 96 * GB, 0.50,
                     "torchtitan benchmarks/llama3_h100_202412_torchtitan.md: H100 96 GB "
                     "HBM2e, 500 W; peak between H100 SXM (989) and NVL (835): 912 assumed",
                     **_H100),
}


def gpu_of(spec: SystemSpec) -> GPU:
    """The :class:`GPU` row for a system's ``gpu`` string (ValueError if it has no peak here)."""
    name = spec.gpu.upper()
    # Longest key first: "GB200" must not match "B200".
    for key in sorted(GPUS, key=len, reverse=True):
        if key in name:
            return GPUS[key]
    raise ValueError(f"system {spec.name!r} (gpu {spec.gpu!r}) has no compute peak in "
                     f"tilecomm.topology.gpus; known GPUs: {', '.join(GPUS)}")

"""Per-GPU compute peaks, HBM capacity and the one stated efficiency per GPU type.

Peaks are dense (no 2:4 sparsity) tensor-core rates in FLOP/s from NVIDIA datasheets; FP8 is
2x BF16 on Hopper and Blackwell (same datasheets). ``efficiency`` is the single assumption of the
workload model per GPU type: the fraction of the BF16/FP8 peak that a transformer layer's compute
(GEMMs, attention, element-wise work, all of it) runs at on one GPU. It is *not* fitted per
validation point; docs/model.md ("Workload model") states how it was chosen and what it yields.
"""

from __future__ import annotations

from dataclasses import dataclass

from .spec import SystemSpec


@dataclass(frozen=True)
class GPU:
    """One GPU type: ``bf16_flops`` and ``fp8_flops`` in FLOP/s (dense), ``hbm_bytes`` in bytes,
    ``efficiency`` the fraction of peak reached by transformer compute (dimensionless)."""

    name: str
    bf16_flops: float
    fp8_flops: float | None
    hbm_bytes: float
    efficiency: float
    source: str

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
# NOTE [one efficiency per GPU type]: 0.50 of peak for Ampere and 0.50 for Hopper/Blackwell
# is the stated assumption (docs/model.md, "Workload model: validation"); the validation table
# there is computed with exactly these values and nothing else fitted.
GPUS = {
    "A100": GPU("A100-SXM4-80GB", 312 * T, None, 80 * GB, 0.50,
                "NVIDIA A100 datasheet: BF16 312 TFLOPS dense, 80 GB HBM2e"),
    "A800": GPU("A800-SXM4-80GB", 312 * T, None, 80 * GB, 0.50,
                "NVIDIA A800 SXM4: A100's tensor cores (BF16 312 TFLOPS dense) and 80 GB, "
                "NVLink 400 GB/s bidirectional"),
    "H100": GPU("H100-SXM5-80GB", 989 * T, 1979 * T, 80 * GB, 0.50,
                "NVIDIA H100 datasheet (SXM): BF16 1,979 TFLOPS with sparsity = 989 dense; "
                "FP8 3,958 sparse = 1,979 dense; 80 GB HBM3"),
    "H800": GPU("H800-SXM5-80GB", 989 * T, 1979 * T, 80 * GB, 0.50,
                "NVIDIA H800 SXM: H100 SXM's tensor cores (BF16 989 dense, FP8 1,979 dense) and "
                "80 GB HBM3, NVLink cut to 400 GB/s bidirectional (DeepSeek-V3 report, sec. 3.1)"),
    "H200": GPU("H200-SXM-141GB", 989 * T, 1979 * T, 141 * GB, 0.50,
                "NVIDIA H200 datasheet: same tensor rates as H100 SXM; 141 GB HBM3e"),
    "B200": GPU("B200", 2250 * T, 4500 * T, 180 * GB, 0.50,
                "NVIDIA DGX B200 datasheet: 72 PFLOPS FP8 training (sparse) per 8 GPUs = 4.5 "
                "PFLOPS dense FP8, 2.25 BF16 per GPU; 1,440 GB per 8 GPUs = 180 GB"),
    "GB200": GPU("GB200", 2500 * T, 5000 * T, 186 * GB, 0.50,
                 "NVIDIA GB200 NVL72 spec: BF16 360 PFLOPS sparse per 72 GPUs = 2.5 PFLOPS "
                 "dense per GPU; 13.4 TB HBM3e per 72 GPUs = 186 GB"),
    "L40S": GPU("L40S", 362 * T, 733 * T, 48 * GB, 0.50,
                "NVIDIA L40S datasheet: BF16 362 TFLOPS dense, FP8 733 dense, 48 GB GDDR6"),
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

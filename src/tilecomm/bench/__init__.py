"""nccl-tests-style benchmarks of tilecomm, with baselines measured in the same run."""

from .runner import BenchConfig, run

__all__ = ["BenchConfig", "run"]

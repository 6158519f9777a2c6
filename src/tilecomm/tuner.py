"""Picks an algorithm per call from the message size and world size.

Thresholds come from measurements on the CPU shared-memory backend (docs/benchmarks.md: 2 and
4 ranks, one_shot wins up to 128-256 KB, two_shot from 512 KB); the cost-model-driven tuner
replaces these rules once the simulator is calibrated for a machine.
"""

from __future__ import annotations

from .settings import settings


def choose(collective: str, nbytes: int, world_size: int) -> str:
    """The algorithm ``auto`` resolves to. Every rank computes the same answer from the same
    arguments; ranks that passed different sizes are caught by the descriptor check anyway."""
    if collective == "all_reduce":
        if nbytes <= settings().one_shot_max or world_size <= 1:
            return "one_shot"
        return "two_shot"
    if collective in ("all_gather", "reduce_scatter"):
        return "direct"
    if collective in ("broadcast", "reduce"):
        return "direct" if world_size <= 8 else "tree"
    if collective in ("all_to_all", "all_to_all_v"):
        return "direct"
    if collective == "barrier":
        return "direct"
    raise ValueError(f"no tuning rule for {collective!r}")

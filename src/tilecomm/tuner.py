"""Picks an algorithm per call from the message size and world size.

Two rule sets, chosen by the backend's ``kind``:

* ``"cpu"`` (the schedule executor): thresholds from measurements on the CPU shared-memory
  backend (docs/benchmarks.md: with the native runner, 2 ranks, one_shot and two_shot tie at
  32 KiB and two_shot wins from 64 KiB; TILECOMM_ONE_SHOT_MAX).
* ``"hier"`` (ranks on several hosts): see :func:`_choose_hier`.
* ``"gpu"`` (the Triton kernels, also when they run in the interpreter): all_reduce is
  one_shot up to TILECOMM_GPU_ONE_SHOT_MAX (256 KiB: one synchronization, latency-bound),
  else two_shot (each rank reads 2(W-1)/W of the message instead of W-1 times it);
  all_gather / reduce_scatter direct (one synchronization, full-mesh NVLink/NVSwitch);
  all_to_all(_v) pairwise; broadcast direct. The threshold is a first guess from the
  traffic ratio, not a GPU measurement yet.

``available`` (the backend's algorithms for the collective) restricts the answer: a preferred
algorithm the backend lacks falls back to its first one. The cost-model-driven tuner replaces
these rules once the simulator is calibrated for a machine.
"""

from __future__ import annotations

from .settings import settings


def choose(collective: str, nbytes: int, world_size: int, *, kind: str = "cpu",
           available: list[str] | None = None) -> str:
    """The algorithm ``auto`` resolves to. Every rank computes the same answer from the same
    arguments; ranks that passed different sizes are caught by the descriptor check anyway."""
    if kind == "gpu":
        algo = _choose_gpu(collective, nbytes, world_size)
    elif kind == "hier":
        algo = _choose_hier(collective, nbytes, world_size)
    elif kind == "cpu":
        algo = _choose_cpu(collective, nbytes, world_size)
    else:
        raise ValueError(f"no tuning rules for backend kind {kind!r}")
    if available is not None and algo not in available:
        if not available:
            raise ValueError(f"{collective}: this backend has no algorithm for it")
        algo = available[0]
    return algo


def _choose_hier(collective: str, nbytes: int, world_size: int) -> str:
    """Ranks on several hosts (``hier/plans.py``): up to TILECOMM_HIER_LEADER_MAX the leader
    algorithms (one inter-host round among the hosts' local rank 0s: fewest synchronizations
    across hosts; docs/benchmarks.md "Across hosts"), above it the rail algorithms where the
    layout is even (every rank busy on the inter-host leg) and the leader ones otherwise (the
    fallback of ``available``); all_to_all on the rails up to TILECOMM_HIER_A2A_RAIL_MAX,
    point-to-point above it and for all_to_all_v."""
    if collective == "all_to_all" and nbytes <= settings().hier_a2a_rail_max:
        return "hier_rail"
    if collective in ("all_to_all", "all_to_all_v"):
        return "hier_direct"
    if collective in ("all_reduce", "all_gather", "reduce_scatter") and \
            nbytes <= settings().hier_leader_max:
        return "hier_leader"
    return "hier_rail"


def _choose_gpu(collective: str, nbytes: int, world_size: int) -> str:
    if collective == "all_reduce":
        return "one_shot" if nbytes <= settings().gpu_one_shot_max else "two_shot"
    if collective in ("all_gather", "reduce_scatter", "broadcast"):
        return "direct"
    if collective in ("all_to_all", "all_to_all_v"):
        return "pairwise"
    return _choose_cpu(collective, nbytes, world_size)


def _choose_cpu(collective: str, nbytes: int, world_size: int) -> str:
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

"""The inter-host curves ``auto`` uses where this machine has no tune file of its own.

Written by ``tilecomm tune --hosts 2 -n 4 --ship`` (2 simulated hosts x 2 ranks, the machine
of docs/benchmarks.md); layouts not listed here are predicted by the hierarchical model.
"""

SOURCE = "shipped defaults"
CURVES: dict[str, list[list[float]]] = {}

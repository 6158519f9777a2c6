"""Baseline: NCCL's own cost model (what NCCL's tuner believes), for comparison with ours.

A re-implementation from the published source, NVIDIA/nccl src/graph/tuning.cc (2.19+),
``ncclTopoTuneModel`` / ``ncclTopoGetAlgoTime``: ``time = latency + bytes / (1000 * algBw)``.

* latency, Ring: ``baseLat + (nsteps - nInterSteps) * intraLat + nInterSteps * interLat``,
  nsteps = 2(n-1) for all_reduce, n-1 for all_gather/reduce_scatter;
  Tree: ``baseLat + 2 ((ppn - 1) intraLat + log2(nNodes) interLat)``; NVLS: ``intraLat``
  (+ ``interLat`` across nodes). LL's intraLat x1.8 across nodes.
* bandwidth: busBw = the graph's bandwidth (here the GPU's NVLink/PCIe rate on one node, the
  node's NIC rate per GPU across nodes); Ring LL ``min(llMaxBw, .5 busBw)``, LL128 ``.92``;
  Tree ``.92`` then LL ``/3.8``, LL128 ``7/9`` (one node) or ``120/128``; algBw = busBw x
  n/nsteps (Ring), x1/2 (Tree), x5/6 (NVLS).
Simplifications (stated): no per-channel caps except llMaxBw (87.7 GB/s, Ampere N1), no tree
correction factors, nChannels folded into the graph bandwidth.
"""

from __future__ import annotations

import math

from tilecomm.topology import Topology

BASE_LAT = {"tree": (6.8, 14.0, 8.4), "ring": (6.6, 14.0, 8.4), "nvls": (0.0, 0.0, 0.0)}
HW_LAT = {  # [intra hw][algo] -> LL, LL128, Simple (us)
    "nvlink": {"tree": (0.6, 1.25, 4.0), "ring": (0.6, 1.9, 3.4), "nvls": (0, 0, 25.0)},
    "pci": {"tree": (1.0, 1.9, 4.0), "ring": (1.0, 2.5, 5.7), "nvls": (0, 0, 0)},
    "net": {"tree": (5.0, 8.5, 14.0), "ring": (2.7, 4.0, 14.0), "nvls": (0, 0, 18.0)},
}
PROTOS = ("LL", "LL128", "Simple")
LL_MAX_BW = 87.7


def nccl_time(topo: Topology, collective: str, nbytes: float, algo: str,
              proto: str) -> float | None:
    """NCCL's predicted time (us), or None where NCCL would not run that combination."""
    n, nodes, ppn = topo.world_size, topo.nodes, topo.gpus
    p = PROTOS.index(proto)
    if n == 1:
        return 0.0
    if algo == "nvls" and (proto != "Simple" or not topo.spec.nvls or collective != "all_reduce"):
        return None
    if algo == "tree" and collective != "all_reduce":
        return None
    if proto == "LL128" and topo.spec.intra == "pcie":
        return None   # LL128 is enabled by default only on NVLink paths (tuning.cc)
    intra_hw = "pci" if topo.spec.intra == "pcie" else "nvlink"
    bw = topo.spec.gpu_link_GBps if nodes == 1 else min(
        topo.spec.gpu_link_GBps, topo.nic_GBps * topo.nics / ppn)
    if collective == "all_reduce":
        nsteps, inter = 2 * (n - 1), 2 * (nodes - 1)
    else:
        nsteps, inter = n - 1, nodes - 1
    intra_lat = HW_LAT[intra_hw][algo][p] * (1.8 if nodes > 1 and proto == "LL" else 1.0)
    inter_lat = HW_LAT["net"][algo][p]
    lat = BASE_LAT[algo][p]
    if algo == "ring":
        lat += (nsteps - inter) * intra_lat + inter * inter_lat
        bus = {"LL": min(LL_MAX_BW, bw * 0.5), "LL128": bw * 0.92, "Simple": bw}[proto]
        alg = bus * n / nsteps
    elif algo == "tree":
        lat += 2 * ((ppn - 1) * intra_lat + math.log2(nodes) * inter_lat)
        bus = bw * 0.92
        bus = {"LL": bus / 3.8, "LL128": bus * (7 / 9 if nodes == 1 else 120 / 128),
               "Simple": bus}[proto]
        alg = bus * 0.5
    else:
        lat = intra_lat + (inter_lat if nodes > 1 else 0.0)
        alg = bw * 5 / 6
    return lat + nbytes / (1000 * alg)


def nccl_best(topo: Topology, collective: str, nbytes: float,
              algos=("ring", "tree", "nvls")) -> tuple[float, str]:
    """NCCL's choice: the fastest (algorithm, protocol) by its own model."""
    best = (math.inf, "")
    for a in algos:
        for p in PROTOS:
            t = nccl_time(topo, collective, nbytes, a, p)
            if t is not None and t < best[0]:
                best = (t, f"{a}/{p}")
    return best

"""``--library rccl``: what RCCL measures on AMD full-mesh nodes, as rccl-tests reports it.

The same two steps as :mod:`~tilecomm.sim.ncclsim` (``--library nccl``), with RCCL's constants:

1. **Choice.** RCCL first offers a collective to MSCCL's internal scheduler: on one node of 8
   gfx942 GPUs (MI300X / MI325X: the topology hint ``mscclEnabled=1`` of the 8-GPU, 7-xGMI-link
   model in ROCm/rccl src/graph/rome_models.cc) all_reduce runs the ``allreduce_pairs`` XML
   algorithms RCCL installs (tools/msccl-algorithms, :data:`MSCCL_ALLPAIRS`) where the size and
   element count fit one (rccl-tests' default float assumed). Otherwise RCCL's tuner picks the
   cheapest (algorithm, protocol) by ``latency + bytes / bandwidth`` (ROCm/rccl
   src/graph/tuning.cc ``ncclTopoTuneModel`` / ``ncclTopoGetAlgoTime``): ring (every
   collective) or tree (all_reduce), LL or Simple (LL128 is off by default on gfx942/gfx950),
   with :data:`BASE_LAT`, ``tuning_model_5`` (gfx942) / ``tuning_model_6`` (gfx950) latencies
   (:data:`HW_LAT`), bandwidth ratios (:data:`BW_RATIO`) and per-size correction factors
   (:data:`TREE_CORR`, :data:`RING_CORR`). Tree/Simple is skipped on one node of gfx942/gfx950.
2. **Time** (ours): ``host_us + latency + (bytes + fill) / realized bandwidth`` as ncclsim, where
   the latency is the same RCCL constant (except the ring/Simple network step, :data:`NET_RING_
   SIMPLE_US`) and the realized bandwidth comes from hardware classes: the xGMI-bound bus
   bandwidth is ``gpu_link_GBps x mesh_eff`` (bound ``mesh``; with fewer GPUs than the node has,
   only their share of links), the network-bound one the node's NIC line x the transport class's
   ``eff`` (bound ``net``); LL moves half (8 data bytes per 16-byte line). RCCL's ring uses many
   channels over different xGMI permutations (rome_models.cc ``ringBase``), so a ring's busbw is
   the GPU's total link rate times ``mesh_eff``, not one link's; across nodes a GPU sends only
   (ppn-1)/ppn of its ring traffic over xGMI (the rest leaves through its NIC), so the xGMI
   bound rises by ppn/(ppn-1).

Versions: :data:`SINCE` (MSCCL on MI300X from RCCL 2.18, ROCm 6.0). Not modeled: MSCCL++ (RCCL
takes it only under graph capture, rccl-tests ``-G``), the newer releases' direct/CE/DDA kernels
and per-size protocol overrides (rocm-systems ``rccl_wrap.cc``), all_to_all.
"""

from __future__ import annotations

import math
import re
from dataclasses import replace

from tilecomm.topology import Topology

from .ncclsim import DEFAULT, NcclParams, NcclRow, fill_bytes, net_hops

PROTOS = ("LL", "Simple")
SRC = "ROCm/rccl src/graph/tuning.cc"
# baseLat [algo] (LL, Simple), us: Tree and Ring {12, 12, 17} (LL128 column left out)
BASE_LAT = {"ring": (12.0, 17.0), "tree": (12.0, 17.0)}
# tuning_model_5 hwLat [link class][algo] (LL, Simple), us; gfx950's model 6 has the same. RCCL
# files xGMI as NVLink ("xgmi" here is its NVLINK row).
HW_LAT = {"xgmi": {"ring": (0.8, 2.1), "tree": (0.9, 2.3)},
          "net": {"ring": (9.5, 320.0), "tree": (10.5, 25.0)}}
# The 320 us NET ring/Simple hwLat of model 5 steers the tuner off ring/Simple across nodes below
# very large sizes; as a time it is not a per-hop latency: the realized one is the same table's
# tree/Simple NET value (topology/presets.py RCCL_TUNING).
NET_RING_SIMPLE_US = 25.0
# bwRatio [<= 2 nodes, > 2 nodes][algo] (LL, Simple)
BW_RATIO = ({"ring": (0.08, 1.00), "tree": (0.06, 0.11)},
            {"ring": (0.08, 1.00), "tree": (0.06, 0.59)})
# getNetOverhead: 2 us on an AMD host CPU, x3 for Simple; bounds a ring's intra-node step across
# nodes from below
NET_OVERHEAD_US = 2.0
# ring/LL broadcast and reduce on one node of gfx942/gfx950: busBw x 1.65 (tuning.cc)
LL_ROOTED_BOOST = 1.65
_LL_TREE = [0.1] * 6 + [1.0, 1.0, 1.0, 1.0, 1.0, 0.6, 1.0, 0.9, 1.0, 1.0] + [0.1] * 11
_LL_RING = [0.1] * 11 + [1.0, 0.2, 1.0, 0.4, 0.4, 0.1, 0.2, 0.2] + [0.1] * 8
# treeCorrectionFactor / ringCorrectionFactor [arch] (LL row, Simple row), index
# clamp(log2(bytes >> 6), 0, 26): rocm-systems projects/rccl tuning.cc tuning_model_5 / _6
TREE_CORR = {"gfx942": (_LL_TREE, [0.1] * 15 + [0.7, 1.0, 1.0, 1.0, 1.0, 1.0, 0.7, 0.7, 0.5,
                                                0.6, 0.6, 0.6]),
             "gfx950": (_LL_TREE, [0.1] * 15 + [0.7, 1.0, 0.1, 0.1, 0.1, 0.1, 0.1, 0.7, 0.15,
                                                0.6, 0.7, 0.6])}
RING_CORR = {"gfx942": (_LL_RING, [0.1] * 22 + [0.7, 0.2, 1.0, 1.0, 1.0]),
             "gfx950": (_LL_RING, [0.1] * 20 + [0.9, 0.1, 1.0, 0.1, 0.6, 1.0, 1.0])}
# MSCCL allreduce_pairs (ROCm/rccl tools/msccl-algorithms allreduce-allpairs-8n-*-op.xml, the
# out-of-place ones): (minBytes, maxBytes, protocol, nchunksperloop); the element count must be a
# multiple of nchunksperloop (msccl_lifecycle.cc). Two all-pairs steps (reduce-scatter, then
# all-gather), each over all 7 links.
MSCCL_ALLPAIRS = ((0, 65536, "LL", 256), (65537, 524287, "LL", 512),
                  (524288, 16777216, "Simple", 512))
MSCCL_DTYPE_BYTES = 4        # rccl-tests' default float
SINCE = {"msccl": (2, 18)}   # MI300X support starts with ROCm 6.0 / RCCL 2.18.3
SUPPORTED = ("all_reduce", "all_gather", "reduce_scatter", "broadcast", "reduce")
ALGOS = ("ring", "tree", "msccl")


def arch(topo: Topology) -> str:
    g = topo.spec.gpu.upper()
    return "gfx950" if ("MI35" in g) else "gfx942"


def _version(topo: Topology) -> tuple:
    v = re.split(r"[-+]", topo.spec.nccl_version)[0]      # "2.22.3-develop", "2.18.3-1"
    return tuple(int(x) for x in v.split(".")) if v else (99,)


def _nsteps(collective: str, n: int) -> int:
    if collective == "all_reduce":
        return 2 * (n - 1)
    return n - 1 if collective in ("all_gather", "reduce_scatter") else n


def _msccl(topo: Topology, collective: str, nbytes: int):
    """The MSCCL allreduce_pairs file that takes this call, or None."""
    if (collective != "all_reduce" or topo.nodes != 1 or topo.gpus != 8 or arch(topo) != "gfx942"
            or _version(topo) < SINCE["msccl"] or nbytes % MSCCL_DTYPE_BYTES):
        return None
    count = nbytes // MSCCL_DTYPE_BYTES
    for lo, hi, proto, chunks in MSCCL_ALLPAIRS:
        if lo <= nbytes <= hi and count > 0 and count % chunks == 0:
            return proto
    return None


def _enabled(topo: Topology, collective: str) -> list[tuple[str, str]]:
    out = [("ring", p) for p in PROTOS]
    if collective == "all_reduce":
        # tuning.cc: Tree/Simple skipped when every rank sits on one node of gfx942/gfx950
        out += [("tree", p) for p in PROTOS if not (p == "Simple" and topo.nodes == 1)]
    return out


def _latency(topo: Topology, collective: str, algo: str, proto: str, tuner: bool) -> float:
    """RCCL's latency for (algo, proto) (tuning.cc formulas); ``tuner`` False: the realized one
    (NET ring/Simple step :data:`NET_RING_SIMPLE_US`)."""
    p = PROTOS.index(proto)
    n, nodes, ppn = topo.world_size, topo.nodes, topo.gpus
    base = BASE_LAT["ring" if algo == "msccl" else algo][p]
    if algo == "msccl":   # assumed: RCCL's launch (baseLat) and two all-pairs xGMI steps
        return base + 2 * HW_LAT["xgmi"]["ring"][p]
    intra = HW_LAT["xgmi"][algo][p]
    inter = HW_LAT["net"]["tree" if ppn == 1 else algo][p]
    if algo == "ring" and proto == "Simple" and not tuner and ppn > 1:
        inter = NET_RING_SIMPLE_US
    nsteps = _nsteps(collective, n)
    if algo == "ring":
        if collective in ("broadcast", "reduce"):
            if not tuner:   # back-to-back calls overlap along the chain: one hop per call, as
                return base + (inter if nodes > 1 else intra)   # ncclsim's measured latency
            hw = HW_LAT["net" if nodes > 1 else "xgmi"]   # tuning.cc, channels differ: nsteps
            return base + nsteps * hw["tree" if proto == "Simple" else "ring"][p]  # x hwLat
        if nodes > 1:
            intra = max(intra, NET_OVERHEAD_US * (3 if proto == "Simple" else 1))
        hops = (2 if collective == "all_reduce" else 1) * (nodes - 1)
        return base + (nsteps - hops) * intra + hops * inter
    return base + 2 * ((ppn - 1) * intra + math.log2(nodes) * inter)     # tree


def _mesh_bus(topo: Topology, prm: NcclParams) -> float:
    """xGMI-bound bus bandwidth: the links among the ranks used x ``mesh_eff``."""
    s = topo.spec
    share = (topo.gpus - 1) / max(1, s.gpus_per_node - 1)
    return s.gpu_link_GBps * share * prm.mesh_eff


def _bandwidth(topo: Topology, collective: str, algo: str, proto: str,
               prm: NcclParams) -> tuple[float, str]:
    """Realized algbw (GB/s) and the class parameter that bounds it (mesh | net)."""
    s, n, nodes = topo.spec, topo.world_size, topo.nodes
    frac = 0.5 if proto == "LL" else 1.0
    mesh = _mesh_bus(topo, prm)
    node_nic = math.inf
    if nodes > 1:
        node_nic = topo.nic_GBps * topo.nics * prm.net_of(topo).eff
        if nodes > s.fabric.nodes_per_leaf:
            node_nic /= max(1.0, s.fabric.oversubscription)
    if algo in ("ring", "msccl"):
        if nodes > 1 and topo.gpus > 1:
            # a ring leaves each node once per channel: channels exit through every GPU's NIC
            # (one ring crossing per NIC), so a GPU sends (ppn-1)/ppn of its ring traffic over
            # xGMI and the rest through its NIC
            mesh *= topo.gpus / (topo.gpus - 1)
        bus, bound = (mesh, "mesh") if mesh <= node_nic else (node_nic, "net")
        factor = n / _nsteps(collective, n) if collective in ("all_reduce", "all_gather",
                                                               "reduce_scatter") else 1.0
        return frac * bus * factor, bound
    chain = frac * mesh * 0.5          # tree: reduce and broadcast share the intra-node chain
    tree_net = frac * node_nic * (1.0 if nodes == 2 else 0.5)
    return (chain, "mesh") if chain <= tree_net else (tree_net, "net")


def _tuner_bw(topo: Topology, collective: str, algo: str, proto: str, nbytes: int) -> float:
    """RCCL's bandwidth belief: bus bandwidth (the realized Simple ring one, default class
    parameters) x bwRatio (x 1.65 rooted LL) -> algbw, x the per-size correction factor."""
    ring = _bandwidth(topo, "all_reduce", "ring", "Simple", DEFAULT)[0]
    bus = ring * 2 * (topo.world_size - 1) / topo.world_size
    p = PROTOS.index(proto)
    bus *= BW_RATIO[0 if topo.nodes <= 2 else 1][algo][p]
    if algo == "ring" and proto == "LL" and collective in ("broadcast", "reduce") \
            and topo.nodes == 1:
        bus *= LL_ROOTED_BOOST
    n = topo.world_size
    bw = bus * (n / _nsteps(collective, n) if algo == "ring" else 0.5)
    log_size = min(26, max(0, int(math.log2(nbytes >> 6)) if nbytes >> 6 else 0))
    if algo == "tree":
        bw *= TREE_CORR[arch(topo)][p][log_size]
    elif topo.nodes > 1:
        bw *= RING_CORR[arch(topo)][p][log_size]
    return bw


def _row(collective, algo, proto, nbytes, topo, prm, tuner_us) -> NcclRow:
    n = topo.world_size
    lat = _latency(topo, collective, algo, proto, tuner=False)
    lat += prm.net_of(topo).lat_us * net_hops(topo, collective, algo) if topo.nodes > 1 else 0.0
    bw, bound = _bandwidth(topo, collective, algo, proto, prm)
    fill = fill_bytes(prm, nbytes, topo.nodes) / (1e3 * bw)
    moved = nbytes / (1e3 * bw)
    t = prm.host_us + lat + fill + moved
    if lat + prm.host_us + fill >= moved:
        bound = "latency"
    return NcclRow(collective, algo, proto, int(nbytes), n, t, tuner_us, bound, lat + fill, bw)


def rccl_rows(collective: str, nbytes: int, topo: Topology, prm: NcclParams = DEFAULT,
              algos=None) -> list[NcclRow]:
    """Every (algorithm, protocol) RCCL would run (or those in ``algos``: ring, tree, msccl),
    RCCL's choice first (MSCCL where it takes the call, else the tuner's cheapest)."""
    if collective not in SUPPORTED:
        raise ValueError(f"--library rccl models {', '.join(SUPPORTED)}; not {collective}")
    if topo.spec.intra != "full_mesh":
        raise ValueError(f"--library rccl models AMD full-mesh nodes (intra \"full_mesh\": "
                         f"mi300x, mi325x, mi355x); {topo.spec.name} has intra "
                         f"\"{topo.spec.intra}\": use --library nccl")
    if topo.gpus < 2:
        raise ValueError(f"--library rccl: {topo.gpus} GPU per node uses no Infinity Fabric link "
                         "(RCCL's rings and trees run through the node's GPUs): use 2 or more")
    if algos:
        bad = [a for a in algos if a not in ALGOS]
        if bad:
            raise ValueError(f"--library rccl: unknown algorithm {bad[0]!r}; choose from "
                             f"{', '.join(ALGOS)}")
    n = topo.world_size
    if n == 1:
        return [NcclRow(collective, "none", "-", int(nbytes), 1, prm.host_us, 0.0, "latency",
                        0.0)]
    rows = []
    for a, p in _enabled(topo, collective):
        if algos and a not in algos:
            continue
        tuner = (_latency(topo, collective, a, p, tuner=True)
                 + nbytes / (1e3 * max(1e-9, _tuner_bw(topo, collective, a, p, nbytes))))
        rows.append(_row(collective, a, p, nbytes, topo, prm, tuner))
    rows.sort(key=lambda r: r.tuner_us)
    proto = _msccl(topo, collective, nbytes)
    if proto and (not algos or "msccl" in algos):
        r = _row(collective, "msccl", proto, nbytes, topo, prm, 0.0)
        rows.insert(0, replace(r, tuner_us=r.time_us - prm.host_us))
    if not rows:
        raise ValueError(f"none of {', '.join(algos)} runs {collective} of {nbytes} B on "
                         f"{topo.spec.name} x{topo.nodes} under RCCL")
    return rows


def rccl_choice(collective: str, nbytes: int, topo: Topology, prm: NcclParams = DEFAULT,
                algos=None) -> NcclRow:
    """What RCCL runs and our prediction of its rccl-tests time."""
    return rccl_rows(collective, nbytes, topo, prm, algos)[0]

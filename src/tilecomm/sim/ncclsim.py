"""``--library nccl``: what NCCL measures, as nccl-tests reports it (out-of-place time per call).

Two steps, kept apart:

1. **Choice** (NCCL's tuner): for every (algorithm, protocol) NCCL would enable on the topology,
   NCCL's own cost estimate ``baseLat + latency(steps, hwLat) + bytes / tunerBw`` (constants of
   NVIDIA/nccl src/graph/tuning.cc, see :data:`BASE_LAT`, :data:`HW_LAT`); the cheapest wins, as
   in ``ncclTopoGetAlgoTime``/``getAlgoInfo``. The set can be restricted to what a measurement
   allowed (``NCCL_ALGO=NVLS`` or ``Ring`` in a published sweep).
2. **Time** (ours): ``host_us + latency + (bytes + fill) / realizedBw`` for the chosen pair
   (``fill`` = ``fill_MB x min(1, bytes / FILL_BYTES)``: the pipeline's buffers), where
   ``latency`` is the same NCCL constant and ``realizedBw`` comes from hardware classes:

   * ring busbw = protocol fraction x min(NVLink line x ``ring_eff``, node NIC line x the
     transport class's ``eff``) (one ring per NIC pair: NCCL opens at least one channel per NIC,
     so every NIC of a node carries one ring crossing and the network-bound busbw is the node's
     NIC total);
   * tree (across nodes) algbw = min(chain on NVLink, node NIC x ``eff`` x k), k = 1 for two
     nodes (each node sends and receives the whole buffer once), 1/2 beyond (double binary tree:
     every node is interior in one tree, 2 S per direction);
   * NVLS (one NVLink domain) algbw = NVLink line x ``nvls_eff``; NVLS-tree across nodes = min of
     that and the tree's network term.

   ``host_us`` is the per-call overhead nccl-tests' timing loop sees (launch, enqueue, completion)
   beyond NCCL's latency constants; ``ring_eff``, ``nvls_eff``, ``mesh_eff`` are per-class
   efficiencies; ``fill_MB`` and ``net_fill_MB`` the pipeline fill (:func:`fill_bytes`). The
   network is a class of its own per transport (:data:`TRANSPORT_CLASS`: InfiniBand, RoCE, EFA,
   TCPX, TCPXO, sockets): each has an achieved fraction of the NIC line (``eff``) and a per-hop
   cost beyond NCCL's NET constant (``lat_us``): NCCL's constants describe InfiniBand verbs;
   EFA's libfabric and TCP stacks pay more per message.
   Their defaults carry sources; ``calibrate --cross-validate`` refits them leaving each system
   out.
3. **Version.** Algorithms appear with the NCCL release that brought them (:data:`SINCE`):
   a system description with ``nccl_version`` older than that does not offer them.
"""

from __future__ import annotations

import math
import re
from dataclasses import asdict, dataclass, field, replace

from tilecomm.algorithms import BUSBW_FACTOR
from tilecomm.topology import Topology

PROTOS = ("LL", "LL128", "Simple")
# tuning.cc baseLat [algo][proto] (us)
BASE_LAT = {"tree": (6.8, 14.0, 8.4), "ring": (6.6, 14.0, 8.4), "nvls": (0.0, 0.0, 0.0),
            "nvls_tree": (0.0, 0.0, 0.0),
            # options (not in the published data; assumed, see OPTIONS_NOTE)
            "pat": (0.0, 0.0, 8.4), "collnet": (0.0, 0.0, 0.0), "p2p": (0.0, 0.0, 8.4)}
# tuning.cc hwLat [link class][algo][proto] (us)
HW_LAT = {
    "nvlink": {"tree": (0.6, 1.25, 4.0), "ring": (0.6, 1.9, 3.4), "nvls": (0, 0, 25.0),
               "nvls_tree": (0, 0, 25.0), "pat": (0, 0, 3.4), "collnet": (0, 0, 3.4),
               "p2p": (0, 0, 3.4)},
    "pci": {"tree": (1.0, 1.9, 4.0), "ring": (1.0, 2.5, 5.7), "nvls": (0, 0, 0),
            "nvls_tree": (0, 0, 0), "pat": (0, 0, 5.7), "collnet": (0, 0, 5.7),
            "p2p": (0, 0, 5.7)},
    "net": {"tree": (5.0, 8.5, 14.0), "ring": (2.7, 4.0, 14.0), "nvls": (0, 0, 18.0),
            "nvls_tree": (0, 0, 14.0), "pat": (0, 0, 14.0), "collnet": (0, 0, 14.0),
            "p2p": (0, 0, 14.0)},
}
OPTIONS_NOTE = ("PAT (all_gather/reduce_scatter, 1 GPU per node, NCCL 2.23+) and CollNet/SHARP "
                "(fabric.sharp): latencies assumed = Ring Simple's hwLat per hop, log2(n) network "
                "hops for PAT, one switch round trip for CollNet; no published sweep validates "
                "them. all_to_all (NCCL's grouped send/recv, 'p2p'): one direct hop at Ring "
                "Simple's latencies, each GPU's bytes to other nodes through its share of the "
                "node's NICs: assumed, tuning.cc has no p2p entry")
TUNING_SRC = "NVIDIA/nccl src/graph/tuning.cc baseLat/hwLat (2.19+)"
# tuning.cc llMaxBws (GB/s of bus bandwidth) for one node / two nodes / more: Ampere
# {87.7, 22.5, 19.0}, Hopper {141.0, 45.0, 35.0} (as mirrored in ROCm/rccl src/graph/tuning.cc);
# Blackwell assumed = Hopper. Across nodes NCCL indexes the row by CPU vendor; the GPU's row is
# used here.
LL_MAX_BW = {"sm80": (87.7, 22.5, 19.0), "sm90": (141.0, 45.0, 35.0),
             "sm100": (141.0, 45.0, 35.0)}
# NCCL release that brought an algorithm (NVIDIA/nccl release notes: NVLS 2.17.1, NVLS+Tree
# 2.18.1, PAT 2.23.4); an unknown version ("") offers everything
SINCE = {"nvls": (2, 17), "nvls_tree": (2, 18), "pat": (2, 23)}
# transport -> network class with its own parameters. InfiniBand and RoCE are NCCL's verbs
# transport; Google's two GPUDirect-over-TCP generations differ by an order of magnitude per
# message (TCPX: ~1 ms at 64 KB on A3 High; TCPXO, offloaded to the NIC: ~0.1 ms on A3 Mega), so
# each is its own class; plain sockets (the host's TCP stack, a copy through host memory) too
TRANSPORT_CLASS = {"ib": "ib", "roce": "roce", "efa": "efa", "tcpx": "tcpx", "tcpxo": "tcpxo",
                   "socket": "socket", "none": "none",
                   "": "ib"}   # not said: InfiniBand's parameters, the unseen-network band
NET_CLASSES = ("ib", "roce", "efa", "tcpx", "tcpxo", "socket")


@dataclass(frozen=True)
class NetClass:
    """A network class: achieved fraction of the NIC line, extra us per network hop."""

    eff: float = 0.9
    lat_us: float = 0.0


# Defaults before any fit (the fit replaces every class some training system informs)
DEFAULT_NET = {"ib": NetClass(0.90, 0.0), "roce": NetClass(0.90, 0.0),
               "efa": NetClass(0.80, 10.0), "tcpx": NetClass(0.75, 30.0),
               "tcpxo": NetClass(0.75, 30.0),
               "socket": NetClass(0.50, 50.0)}
NET_SOURCES = {
    "ib": "eff 0.9 assumed, lat 0: NCCL's NET hwLat constants are InfiniBand's (tuning.cc)",
    "roce": "as InfiniBand (verbs over Ethernet, same NCCL transport)",
    "efa": "assumed eff 0.8, +10 us per hop (libfabric SRD through aws-ofi-nccl); no fit",
    "tcpx": "assumed eff 0.75, +30 us per hop (a TCP stack per message, GPUDirect); no fit",
    "tcpxo": "assumed eff 0.75, +30 us per hop (TCP offloaded to the NIC, GPUDirect); no fit",
    "socket": "assumed eff 0.5, +50 us per hop (host TCP and a copy through host memory); "
              "no fit",
}


@dataclass(frozen=True)
class NcclParams:
    """Class parameters of the nccl-tests-as-measured model (see module docstring)."""

    host_us: float = 4.0     # per call, beyond NCCL's latency constants
    ring_eff: float = 0.80   # Simple ring busbw / NVLink line rate
    nvls_eff: float = 0.61   # NVLS all_reduce algbw / NVLink line rate
    fill_MB: float = 0.0     # pipeline fill (MB moved at the row's bandwidth), see FILL_BYTES
    net_fill_MB: float = 0.0  # more fill where a collective crosses nodes (fill_bytes)
    mesh_eff: float = 0.7    # full-mesh nodes (AMD xGMI): ring busbw / a GPU's total link rate
    net: dict = field(default_factory=lambda: dict(DEFAULT_NET), compare=False, hash=False)
    sources: dict = field(default_factory=lambda: dict(DEFAULT_SOURCES), compare=False,
                          hash=False)

    def with_(self, **kw) -> "NcclParams":
        return replace(self, **kw)

    def net_of(self, topo: Topology) -> NetClass:
        """The network class of ``topo``'s transport (ValueError for ``none`` across nodes)."""
        t = topo.spec.fabric.transport
        cls = TRANSPORT_CLASS[t]
        if cls == "none":
            raise ValueError(f"{topo.spec.name} spans {topo.nodes} nodes but its fabric.transport "
                             "is 'none'")
        return self.net[cls]

    def net_fitted(self, cls: str) -> bool:
        """Whether some measured system informed class ``cls`` (else it keeps assumed values)."""
        return self.sources.get(f"net.{cls}", "").startswith("fitted")

    def as_dict(self) -> dict:
        d = asdict(self)
        d.pop("sources")
        d["net"] = {k: asdict(v) for k, v in self.net.items()}
        return d

    @classmethod
    def from_dict(cls, d: dict, sources: dict | None = None) -> "NcclParams":
        d = dict(d)
        net = {**DEFAULT_NET, **{k: NetClass(**v) for k, v in d.pop("net", {}).items()}}
        return cls(**d, net=net, sources={**DEFAULT_SOURCES, **(sources or {})})


DEFAULT_SOURCES = {
    "host_us": "default 4 us (CUDA launch + nccl-tests loop); refitted leave-one-system-out",
    "ring_eff": "0.8: NVIDIA/nccl-tests#212 (sjeaugey: ~20% protocol overhead on NVLink)",
    "nvls_eff": "0.61: NVIDIA/nccl-tests#212 (sjeaugey: 8x H100 NVLS algbw ~275 of 450 GB/s)",
    "fill_MB": "0: refitted leave-one-system-out on one-node middle-regime rows",
    "net_fill_MB": "0: refitted leave-one-system-out on multi-node middle-regime rows",
    "mesh_eff": "0.7: assumed; refitted leave-one-system-out on full-mesh single-node sweeps",
    "latency": TUNING_SRC,
    **{f"net.{k}": v for k, v in NET_SOURCES.items()},
}
DEFAULT = NcclParams()
# Pipeline fill: before a pipelined collective streams at its bandwidth its buffers must fill
# (chunks in flight on every channel and step); modeled as moving fill_MB more at the row's
# bandwidth, fill_MB x min(1, bytes / FILL_BYTES). FILL_BYTES = 32 MiB = 8 x NCCL_BUFFSIZE
# (4 MiB default per channel): an assumed shape, not fitted.
FILL_BYTES = 32 << 20


def fill_bytes(prm: "NcclParams", nbytes: float, nodes: int) -> float:
    """Bytes of pipeline fill a call of ``nbytes`` pays (moved at its own bandwidth): one node's
    ``fill_MB``, plus ``net_fill_MB`` across nodes, where every network hop adds its chunks in
    flight (published multi-node sweeps run 20-60% slower than their streaming rate between
    1 and 64 MB), both ``x min(1, nbytes / FILL_BYTES)``."""
    mb = prm.fill_MB + (prm.net_fill_MB if nodes > 1 else 0.0)
    return mb * 1e6 * min(1.0, nbytes / FILL_BYTES)


def gpu_class(topo: Topology) -> str:
    g = topo.spec.gpu.upper()
    if "A100" in g or "A800" in g:
        return "sm80"
    if "B200" in g or "GB200" in g or "B100" in g or "GB300" in g or "B300" in g:
        return "sm100"
    return "sm90"


@dataclass(frozen=True)
class NcclRow:
    """One (algorithm, protocol) as NCCL runs it on one size."""

    collective: str
    algo: str
    protocol: str
    nbytes: int
    world_size: int
    time_us: float       # our prediction of the nccl-tests time
    tuner_us: float      # NCCL's own estimate (what its choice is based on)
    bound: str           # which class parameter bounds the transfer: nvlink|nvls|net|latency
    lat_us: float        # NCCL latency constant part and pipeline fill (without host_us)
    bw_GBps: float = 0.0  # realized streaming algbw of the row

    @property
    def algbw_GBps(self) -> float:
        return self.nbytes / (self.time_us * 1e3) if self.time_us > 0 else float("inf")

    @property
    def busbw_GBps(self) -> float:
        return self.algbw_GBps * BUSBW_FACTOR.get(self.collective, lambda n: 1.0)(self.world_size)


def _version(topo: Topology) -> tuple:
    v = re.split(r"[-+]", topo.spec.nccl_version)[0]
    return tuple(int(x) for x in v.split(".")) if v else (99,)


def _enabled(topo: Topology, collective: str) -> list[tuple[str, str]]:
    out = _enabled_any_version(topo, collective)
    v = _version(topo)
    return [(a, p) for a, p in out if v >= SINCE.get(a, (0,))]


def _enabled_any_version(topo: Topology, collective: str) -> list[tuple[str, str]]:
    s = topo.spec
    if collective == "all_to_all":
        return [("p2p", "Simple")]
    out = []
    pcie = s.intra == "pcie"
    for p in PROTOS:
        if p == "LL128" and pcie:
            continue   # LL128 only on NVLink paths (tuning.cc typeIntra <= PATH_NVB)
        out.append(("ring", p))
        if collective == "all_reduce" and topo.nodes > 1:
            out.append(("tree", p))
    if collective == "all_reduce" and s.nvls and topo.gpus > 1:
        out.append(("nvls" if topo.nodes == 1 else "nvls_tree", "Simple"))
    if collective in ("all_gather", "reduce_scatter") and topo.gpus == 1 and topo.nodes > 1:
        out.append(("pat", "Simple"))
    if collective == "all_reduce" and topo.nodes > 1 and s.fabric.sharp:
        out.append(("collnet", "Simple"))
    return out


def _nsteps(collective: str, n: int) -> int:
    return 2 * (n - 1) if collective == "all_reduce" else n - 1


def _intra_hw(topo: Topology) -> str:
    """NCCL's link class inside a node (tuning.cc hwLat row): PCI or NVLink."""
    return "pci" if topo.spec.intra == "pcie" else "nvlink"


def _latency(topo: Topology, collective: str, algo: str, proto: str,
             net_extra_us: float = 0.0) -> float:
    """NCCL's latency for (algo, proto) on ``topo`` (us): tuning.cc's formulas, with
    ``net_extra_us`` more per network hop (the transport's cost beyond NCCL's constant)."""
    n, nodes, ppn = topo.world_size, topo.nodes, topo.gpus
    p = PROTOS.index(proto)
    intra = HW_LAT[_intra_hw(topo)][algo][p] * (1.8 if nodes > 1 and proto == "LL" else 1.0)
    inter = HW_LAT["net"][algo][p] + net_extra_us
    base = BASE_LAT[algo][p]
    hops = net_hops(topo, collective, algo)
    if algo == "ring":
        hops = (2 if collective == "all_reduce" else 1) * (nodes - 1)
        nsteps = _nsteps(collective, n)
        return base + (nsteps - hops) * intra + hops * inter
    if algo == "tree":
        return base + 2 * (ppn - 1) * intra + hops * inter
    if algo == "nvls":
        return intra
    if algo == "pat":
        return base + hops * inter
    if algo == "collnet":   # intra-node reduce-scatter + all-gather, one trip through the switch
        return base + 2 * (ppn - 1) * intra + hops * inter
    if algo == "p2p":       # every peer directly, concurrently
        return base + (inter if nodes > 1 else intra)
    return intra + hops * inter      # nvls_tree


def _measured_latency(topo: Topology, collective: str, algo: str, proto: str,
                      net_extra_us: float) -> float:
    """The latency nccl-tests' loop sees. broadcast and reduce flow one way along the ring, so
    back-to-back calls overlap along the chain: each call costs one hop (the slowest, the
    network's where the ring crosses nodes), not the chain's depth (published sweeps: a 16-node
    broadcast of 16 B reports the same ~7.5 us as one node). Everything else: NCCL's formula."""
    if collective in ("broadcast", "reduce") and algo == "ring":
        p = PROTOS.index(proto)
        hw = HW_LAT["net"][algo][p] + net_extra_us if topo.nodes > 1 else \
            HW_LAT[_intra_hw(topo)][algo][p]
        return BASE_LAT[algo][p] + hw
    return _latency(topo, collective, algo, proto, net_extra_us)


def net_hops(topo: Topology, collective: str, algo: str) -> float:
    """Network hops in the latency nccl-tests sees for (algo): NCCL's formula (tuning.cc), one
    for ring broadcast/reduce (:func:`_measured_latency`)."""
    nodes = topo.nodes
    if nodes <= 1:
        return 0.0
    if algo == "ring" and collective in ("broadcast", "reduce"):
        return 1.0
    if algo == "ring":
        return float((2 if collective == "all_reduce" else 1) * (nodes - 1))
    if algo == "pat":
        return math.log2(nodes)
    if algo == "collnet":
        return 2.0
    if algo == "p2p":
        return 1.0
    return 2 * math.log2(nodes)      # tree, nvls_tree: up and down


def _proto_frac(topo: Topology, proto: str, bus: float) -> float:
    if proto == "LL":
        return min(LL_MAX_BW[gpu_class(topo)][min(topo.nodes, 3) - 1], 0.5 * bus)
    if proto == "LL128":
        return 0.92 * bus
    return bus


def _bandwidth(topo: Topology, collective: str, algo: str, proto: str,
               prm: NcclParams) -> tuple[float, str]:
    """Realized algbw (GB/s) and the class parameter that bounds it."""
    s = topo.spec
    n, nodes = topo.world_size, topo.nodes
    link = s.gpu_link_GBps * prm.ring_eff
    node_nic = topo.nic_GBps * topo.nics * prm.net_of(topo).eff if nodes > 1 else math.inf
    if nodes > s.fabric.nodes_per_leaf:
        # rings and trees span leaves: every node's traffic climbs to the spine, whose uplinks
        # carry 1 / oversubscription of the leaf's NIC bandwidth (rail-optimized or not: NCCL
        # keeps each channel on one rail, so only the leaf-spine ratio matters)
        node_nic /= max(1.0, s.fabric.oversubscription)
    if algo == "ring":
        bus, bound = (link, "nvlink") if link <= node_nic else (node_nic, "net")
        bus = _proto_frac(topo, proto, bus)
        nsteps = _nsteps(collective, n)
        factor = n / nsteps if collective in ("all_reduce", "all_gather", "reduce_scatter") \
            else 1.0
        return bus * factor, bound
    if algo == "pat":
        return _bandwidth(topo, collective, "ring", "Simple", prm)
    if algo == "p2p":
        # all_to_all: a GPU sends (ppn-1)/n of its buffer over its links and (n-ppn)/n through
        # its share (1/ppn) of the node's NICs, both at once
        ppn = topo.gpus
        t_in = (ppn - 1) / n / link
        t_net = (n - ppn) / n / (node_nic / ppn) if nodes > 1 else 0.0
        return (1.0 / t_in, "nvlink") if t_in >= t_net else (1.0 / t_net, "net")
    if algo == "collnet":
        # each node sends its partial sums once and receives the result once (the switch
        # reduces): network algbw = node NIC total; inside: reduce-scatter + all-gather
        g = topo.gpus
        intra = link * g / (2 * (g - 1)) if g > 1 else math.inf
        return (intra, "nvlink") if intra <= node_nic else (node_nic, "net")
    tree_net = node_nic * (1.0 if nodes == 2 else 0.5)
    if algo == "tree":
        chain = _proto_frac(topo, proto, link) * 0.5   # reduce and broadcast share the chain
        return (chain, "nvlink") if chain <= tree_net else (
            _proto_frac(topo, proto, tree_net), "net")
    nv = s.gpu_link_GBps * prm.nvls_eff
    if algo == "nvls":
        return nv, "nvls"
    return (nv, "nvls") if nv <= tree_net else (tree_net, "net")


def _tuner_bw(topo: Topology, collective: str, algo: str, proto: str) -> float:
    """NCCL's own bandwidth belief for its choice: tree ~ 0.92 x busBw / 2 (tuning.cc), the
    rest as realized with the default class parameters."""
    if algo == "tree":
        ring_bus = _bandwidth(topo, "all_reduce", "ring", "Simple", DEFAULT)[0] * \
            2 * (topo.world_size - 1) / topo.world_size
        bus = ring_bus * 0.92
        bus = {"LL": bus / 3.8, "LL128": bus * 120 / 128, "Simple": bus}[proto]
        return bus * 0.5
    return _bandwidth(topo, collective, algo, proto, DEFAULT)[0]


SUPPORTED = ("all_reduce", "all_gather", "reduce_scatter", "broadcast", "reduce", "all_to_all")


def _check(collective: str, topo: Topology) -> None:
    if collective not in SUPPORTED:
        raise ValueError(f"--library nccl models {', '.join(SUPPORTED)}; not {collective}")
    if topo.spec.intra == "shm":
        raise ValueError(f"--library nccl needs a GPU system; {topo.spec.name} is shared-memory "
                         "CPU processes")
    if topo.spec.intra == "full_mesh":
        raise ValueError(f"--library nccl models NVIDIA systems; {topo.spec.name} is an AMD "
                         "full-mesh node (intra \"full_mesh\"): use --library rccl")


# NCCL's choice depends on the system, the call and NCCL's own constants, never on the fitted
# class parameters: cached, so that a fit re-times only the chosen pair of each row
_RANKING: dict = {}


def _ranking(collective: str, nbytes: int, topo: Topology, algos) -> list[tuple[float, str, str]]:
    """(NCCL's estimate in us, algo, protocol) of every enabled pair (or those in ``algos``),
    cheapest first."""
    key = (collective, int(nbytes), topo.spec, topo.nodes, topo.gpus, algos)
    hit = _RANKING.get(key)
    if hit is None:
        hit = []
        for a, p in _enabled(topo, collective):
            if algos and a not in algos and not (a == "nvls_tree" and "nvls" in algos):
                continue
            est = _latency(topo, collective, a, p) + nbytes / (1e3 * _tuner_bw(topo, collective,
                                                                               a, p))
            hit.append((est, a, p))
        if not hit:
            raise ValueError(f"none of {algos} is enabled for {collective} on {topo.spec.name}")
        hit.sort(key=lambda x: x[0])
        if len(_RANKING) > 200_000:
            _RANKING.clear()
        _RANKING[key] = hit
    return hit


def _timed(collective: str, nbytes: int, topo: Topology, prm: NcclParams, a: str, p: str,
           tuner: float) -> NcclRow:
    """Our prediction of the nccl-tests time of (algo ``a``, protocol ``p``)."""
    lat = _measured_latency(topo, collective, a, p,
                            prm.net_of(topo).lat_us if topo.nodes > 1 else 0.0)
    bw, bound = _bandwidth(topo, collective, a, p, prm)
    fill = fill_bytes(prm, nbytes, topo.nodes) / (1e3 * bw)
    t = prm.host_us + lat + fill + nbytes / (1e3 * bw)
    if lat + prm.host_us + fill >= nbytes / (1e3 * bw):
        bound = "latency"
    return NcclRow(collective, a, p, int(nbytes), topo.world_size, t, tuner, bound, lat + fill, bw)


def nccl_rows(collective: str, nbytes: int, topo: Topology, prm: NcclParams = DEFAULT,
              algos=None) -> list[NcclRow]:
    """Every (algo, protocol) NCCL enables (or those in ``algos``), NCCL's choice first."""
    _check(collective, topo)
    if topo.world_size == 1:
        return [NcclRow(collective, "none", "-", int(nbytes), 1, prm.host_us, 0.0, "latency", 0.0)]
    return [_timed(collective, nbytes, topo, prm, a, p, est)
            for est, a, p in _ranking(collective, nbytes, topo, algos)]


def nccl_choice(collective: str, nbytes: int, topo: Topology, prm: NcclParams = DEFAULT,
                algos=None) -> NcclRow:
    """What NCCL runs (its tuner's cheapest) and our prediction of its nccl-tests time."""
    _check(collective, topo)
    if topo.world_size == 1:
        return nccl_rows(collective, nbytes, topo, prm, algos)[0]
    est, a, p = _ranking(collective, nbytes, topo, algos)[0]
    return _timed(collective, nbytes, topo, prm, a, p, est)

"""Collective times for a group of ranks placed on a system, from tilecomm's simulator.

A workload's group (a TP group, a DP group, ...) is described by its size and its *stride* in
the global rank order (block placement: rank r on node r // gpus_per_node). From those follow
how many members share a node and how many nodes the group spans; the collective is then timed
by :func:`tilecomm.sim.predict` on a topology of exactly that shape.

NOTE [concurrent groups share the node's NICs]
    With stride s < gpus_per_node, G/(s*k) groups run side by side on every node, each with k
    members there. The topology built for one group gives it ``min(nics, k)`` NICs; when the
    node has fewer NICs than GPUs (pcie-8gpu: 2 for 8) that overstates its share, so the NIC rate
    is scaled to the group's fair share ``nics * k / G``. NVLink ports are per GPU and the
    NVSwitch is non-blocking, so the intra-node share needs no correction.

NOTE [algorithms NCCL runs, two levels across nodes]
    Frameworks run these collectives through NCCL, so only algorithms NCCL has are offered:
    all_reduce ring / dbtree / nvls (and the hierarchical builder), all_gather and
    reduce_scatter ring, all_to_all direct (one grouped send/recv per peer), send_recv. The
    simulator's flat ring crosses each node boundary once (one NIC), while NCCL runs one ring per
    NIC (docs/model.md, Known gaps); for a group with several members per node across nodes the
    time is therefore the minimum of the flat collective and a two-level composition (intra-node
    part on NVLink, then k concurrent inter-node groups of one member per node on S/k bytes),
    each part timed by the simulator.

NOTE [size grid]
    A search asks for thousands of sizes. Times are simulated at powers of two and interpolated
    linearly in bytes between the two neighbours (exact for the alpha-beta regime both sides of
    a grid point share); each (collective, shape, grid size) is simulated once per process.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache

from tilecomm.sim import predict
from tilecomm.sim.api import candidates
from tilecomm.topology import SystemSpec, Topology, load_system

NCCL_ALGOS = {
    "all_reduce": ("nvls", "ring", "dbtree", "hierarchical"),
    "all_gather": ("ring",),
    "reduce_scatter": ("ring",),
    "all_to_all": ("direct", "pairwise", "bruck"),
    "send_recv": ("pairwise",),
}


@dataclass(frozen=True)
class Placement:
    """Where a group's ranks sit: ``nodes`` nodes with ``per_node`` members each."""

    size: int
    nodes: int
    per_node: int

    @property
    def intra(self) -> bool:
        """True when the whole group is inside one node (NVLink domain)."""
        return self.nodes == 1

    def describe(self) -> str:
        return (f"{self.size} ranks in 1 node" if self.nodes == 1 else
                f"{self.size} ranks over {self.nodes} nodes ({self.per_node}/node)")


def place(size: int, stride: int, gpus_per_node: int) -> Placement:
    """Placement of a group of ``size`` ranks ``stride`` apart under block placement."""
    if size <= 1:
        return Placement(max(size, 1), 1, max(size, 1))
    if stride >= gpus_per_node:
        return Placement(size, size, 1)
    per = max(1, min(size, gpus_per_node // stride))
    return Placement(size, math.ceil(size / per), per)


@lru_cache(maxsize=64)
def spec_of(system: str) -> SystemSpec:
    try:
        return load_system(system)
    except FileNotFoundError:
        raise ValueError(f"system file {system} not found (a preset name or a system "
                         ".json; see docs/system-description.md)") from None


def _shared_spec(spec: SystemSpec, per_node: int) -> SystemSpec:
    """``spec`` with the NIC rate scaled to one group's fair share (NOTE [concurrent groups])."""
    if spec.nics_per_node >= spec.gpus_per_node:
        return spec       # every GPU has NICs of its own (Topology gives it their sum)
    topo_nics = min(spec.nics_per_node, per_node)
    share = spec.nics_per_node * per_node / spec.gpus_per_node
    if topo_nics <= 0 or share >= topo_nics:
        return spec
    return spec.with_(nic_GBps=spec.nic_GBps * share / topo_nics)


@lru_cache(maxsize=200_000)
def _sim_us(collective: str, nbytes: int, system: str, nodes: int, per_node: int) -> float:
    """Fastest NCCL-available algorithm's time (us) on one group shape, one size."""
    spec = _shared_spec(spec_of(system), per_node) if nodes > 1 else spec_of(system)
    topo = Topology(spec, nodes, per_node)
    # NCCL's algorithms are what-ifs to the simulator (models, not tilecomm's runtime)
    ok = set(candidates(collective, topo, what_if=True))
    algos = [a for a in NCCL_ALGOS[collective] if a in ok]
    if not algos:
        raise ValueError(f"no NCCL algorithm for {collective} on {nodes}x{per_node} "
                         f"{system} is small enough to simulate")
    times = []
    for a in algos:
        p = predict(collective, nbytes, system=spec, nodes=nodes, gpus=per_node, algo=a,
                    engine="phases", what_if=True)
        times.append(p[0].time_us)
    return min(times)


def _grid_us(collective: str, nbytes: int, system: str, nodes: int, per_node: int) -> float:
    """Flat collective time, interpolated between power-of-two sizes (NOTE [size grid])."""
    if nbytes <= 0:
        return 0.0
    lo = 1 << max(0, int(nbytes).bit_length() - 1)
    if lo == nbytes:
        return _sim_us(collective, lo, system, nodes, per_node)
    hi = lo << 1
    t_lo = _sim_us(collective, lo, system, nodes, per_node)
    t_hi = _sim_us(collective, hi, system, nodes, per_node)
    return t_lo + (t_hi - t_lo) * (nbytes - lo) / (hi - lo)


def collective_us(collective: str, nbytes: float, system: str, pl: Placement) -> float:
    """Time (us) of one ``collective`` of ``nbytes`` (nccl-tests size convention) on ``pl``.

    all_reduce: the buffer; all_gather: the output; reduce_scatter, all_to_all: the input;
    send_recv: the message. Zero for a group of one rank.
    """
    if pl.size <= 1 or nbytes <= 0:
        return 0.0
    n = int(math.ceil(nbytes))
    if collective == "send_recv":
        return _grid_us("send_recv", n, system, pl.nodes, pl.per_node)
    flat = _grid_us(collective, n, system, pl.nodes, pl.per_node)
    if pl.nodes == 1 or pl.per_node == 1 or collective == "all_to_all":
        return flat
    # Two-level composition (NOTE [algorithms NCCL runs, two levels across nodes]).
    k = pl.per_node
    intra = Placement(k, 1, k)
    inter = Placement(pl.nodes, pl.nodes, 1)
    if collective == "all_reduce":
        two = (collective_us("reduce_scatter", n, system, intra) +
               collective_us("all_reduce", n / k, system, inter) +
               collective_us("all_gather", n, system, intra))
    else:   # all_gather / reduce_scatter: node-level part of S/k, then the NVLink part
        two = (collective_us(collective, n / k, system, inter) +
               collective_us(collective, n, system, intra))
    return min(flat, two)


@lru_cache(maxsize=20_000)
def _moe_sim(tokens: int, row_b: int, topk: int, experts: int, system: str, nodes: int,
             per_node: int) -> tuple[float, float]:
    """(dispatch us, combine us) of ``tokens`` tokens per rank, rows of ``row_b`` bytes."""
    from tilecomm.sim.moe import predict_moe

    spec = _shared_spec(spec_of(system), per_node) if nodes > 1 else spec_of(system)
    p = predict_moe(spec, nodes, per_node, tokens, 1, topk, experts, expected=True,
                    engine="phases", dispatch_row_bytes=row_b, combine_row_bytes=row_b)
    return p.dispatch.time_us, p.combine.time_us


def moe_us(tokens: float, hidden: int, itemsize: float, topk: int, experts: int, system: str,
           pl: Placement) -> tuple[float, float, float]:
    """MoE dispatch and combine time (us) of ``tokens`` tokens per rank over the EP group
    ``pl`` (tilecomm.sim.moe, normal mode, the expected traffic of uniform routing: a token
    goes once to each rank owning one of its ``topk`` experts and crosses the network once per
    destination node), and the bytes one rank sends per call. Tokens are simulated at powers of
    two and interpolated linearly (NOTE [size grid]). Zero for a group of one rank."""
    if pl.size <= 1 or tokens <= 0:
        return 0.0, 0.0, 0.0
    from tilecomm.sim.moe import expected_traffic

    row_b = max(1, int(round(hidden * itemsize)))
    sent = float(expected_traffic(pl.size, pl.per_node, tokens, topk, experts).counts[0].sum()
                 ) * row_b

    def at(n: int) -> tuple[float, float]:
        return _moe_sim(n, row_b, topk, experts, system, pl.nodes, pl.per_node)

    lo = 1 << (max(1, int(tokens)).bit_length() - 1)
    if lo >= tokens:
        d, c = at(lo)
        return d, c, sent
    hi = lo << 1
    (d0, c0), (d1, c1) = at(lo), at(hi)
    f = (tokens - lo) / (hi - lo)
    return d0 + (d1 - d0) * f, c0 + (c1 - c0) * f, sent


def p2p_us(nbytes: float, system: str, cross_node: bool) -> float:
    """Time (us) of one point-to-point message between neighbouring pipeline stages."""
    pl = Placement(2, 2, 1) if cross_node else Placement(2, 1, 2)
    return collective_us("send_recv", nbytes, system, pl)


def cache_info():
    """Simulator calls made and reused (for --verbose and tests)."""
    return _sim_us.cache_info()

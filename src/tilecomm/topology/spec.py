"""System description: the immutable parameters of one node type and its scale-out fabric.

Units everywhere in this package: bandwidth in GB/s (1e9 bytes/s) *per direction*, latency in
microseconds, sizes in bytes. A :class:`SystemSpec` describes *one node* plus the fabric that joins
nodes; :func:`tilecomm.topology.build` turns it into a :class:`~tilecomm.topology.model.Topology`
for a given number of nodes.

NOTE [protocols carry the latencies]
    Following NCCL's tuning model (src/graph/tuning.cc: ``baseLat`` per algorithm/protocol and
    ``hwLat`` per link class), per-step latency is a property of the *protocol* on a *link class*
    (intra-node fabric or network), not of a wire. A protocol also scales usable bandwidth by its
    efficiency (LL carries 8 bytes of data per 16-byte line, so 0.5; LL128 120/128; Simple ~0.8
    measured). The simulator evaluates every protocol and keeps the fastest, like NCCL's tuner.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field, replace

# Intra-node fabrics: NVSwitch (every GPU one port into a switch), PCIe (switches and a CPU
# root complex), shm (processes on one host), full_mesh (every GPU wired to every other by its
# own point-to-point link: AMD MI300X / MI325X / MI355X, 7 Infinity Fabric (xGMI) links each;
# ``gpu_link_GBps`` stays the GPU's total, each link carries ``gpu_link_GBps / (gpus_per_node -
# 1)`` per direction).
INTRA_KINDS = ("nvswitch", "pcie", "shm", "full_mesh")
# Network transports between nodes: InfiniBand verbs, RoCE (verbs over Ethernet), AWS EFA
# (libfabric through aws-ofi-nccl), Google's GPUDirect over TCP (TCPX: A3 High, TCPXO: A3 Mega),
# plain TCP sockets (NCCL_NET=Socket), none (one node); "" = not said (the model then uses
# InfiniBand's parameters with the wider band of a network it has not seen).
TRANSPORTS = ("ib", "roce", "efa", "tcpx", "tcpxo", "socket", "none", "")


def _number(where: str, name: str, v) -> float:
    """``v`` as a finite real number, or ValueError naming the field."""
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
        raise ValueError(f"{where}{name} must be a finite number, got {v!r}")
    return v


def _positive(where: str, name: str, v) -> None:
    if _number(where, name, v) <= 0:
        raise ValueError(f"{where}{name} must be > 0, got {v!r}")


def _nonneg(where: str, name: str, v) -> None:
    if _number(where, name, v) < 0:
        raise ValueError(f"{where}{name} must be >= 0, got {v!r}")


def _count(where: str, name: str, v, least: int) -> None:
    if isinstance(v, bool) or not isinstance(v, int):
        raise ValueError(f"{where}{name} must be an integer, got {v!r}")
    if v < least:
        raise ValueError(f"{where}{name} must be >= {least}, got {v!r}")


@dataclass(frozen=True)
class Protocol:
    """A wire protocol: usable fraction of link bandwidth and its latencies (us)."""

    name: str
    eff: float              # fraction of link bandwidth delivered to payload
    step_intra_us: float    # per step (one hop of a phase) over the intra-node fabric
    step_net_us: float      # per step when the step crosses the network
    base_us: float = 0.0    # once per collective (NCCL baseLat)

    def __post_init__(self):
        if not isinstance(self.name, str) or not self.name:
            raise ValueError(f"protocol name must be a non-empty string, got {self.name!r}")
        where = f"protocol {self.name}: "
        e = _number(where, "eff", self.eff)
        if not 0 < e <= 1:
            raise ValueError(f"{where}eff must be in (0, 1], got {e!r}")
        for k in ("step_intra_us", "step_net_us", "base_us"):
            _nonneg(where, k, getattr(self, k))


@dataclass(frozen=True)
class Fabric:
    """Scale-out network joining nodes (fat tree).

    ``nodes_per_leaf``: nodes under one leaf switch (per rail when ``rail_optimized``).
    ``leaves_per_pod``: leaves under one spine group; more leaves need a third (core) level.
    ``oversubscription``: leaf downlink capacity / uplink capacity (1.0 = non-blocking).
    """

    rail_optimized: bool = True
    nodes_per_leaf: int = 32
    leaves_per_pod: int = 32
    oversubscription: float = 1.0
    levels: int = 2   # 2: leaf-spine; 3: leaf-spine-core
    sharp: bool = False   # in-network reduction (InfiniBand SHARP / NCCL CollNet) available
    # what carries NCCL's messages between nodes (TRANSPORTS); its per-message cost and
    # achieved fraction of the NIC line are class parameters of the ``--library nccl`` model
    transport: str = ""

    def __post_init__(self):
        if not isinstance(self.rail_optimized, bool):
            raise ValueError(f"fabric.rail_optimized must be true or false, "
                             f"got {self.rail_optimized!r}")
        _count("fabric.", "nodes_per_leaf", self.nodes_per_leaf, 1)
        _count("fabric.", "leaves_per_pod", self.leaves_per_pod, 1)
        _count("fabric.", "levels", self.levels, 2)
        if not isinstance(self.sharp, bool):
            raise ValueError(f"fabric.sharp must be true or false, got {self.sharp!r}")
        if self.levels > 3:
            raise ValueError(f"fabric.levels must be 2 or 3, got {self.levels!r}")
        _positive("fabric.", "oversubscription", self.oversubscription)
        if self.transport not in TRANSPORTS:
            raise ValueError(f"fabric.transport must be one of {', '.join(t for t in TRANSPORTS if t)}"
                             f" (or left out), got {self.transport!r}")


@dataclass(frozen=True)
class ShmCost:
    """Cost parameters of tilecomm's shared-memory runtime on one host (``sim/cpu_loop.py``).

    A collective costs ``call_us`` (Python per call) + ``sync_us`` per synchronization (handshake,
    one per remote phase and piece) + ``op_us`` per numpy operation + its copied and reduced bytes
    at cache rates when the operation's working set fits in ``cache_bytes``, DRAM rates otherwise. ``piece_bytes`` is the runtime's TILECOMM_PIECE_BYTES (not fitted);
    ``single_copy_min_bytes`` its TILECOMM_CMA_MIN_BYTES where peers may read a rank's tensors in
    place (process_vm_readv), 0 where they may not (every symmetric user tensor is staged).
    """

    call_us: float
    sync_us: float
    op_us: float
    copy_cache_GBps: float
    add_cache_GBps: float
    copy_dram_GBps: float
    add_dram_GBps: float
    cache_bytes: int
    piece_bytes: int = 1 << 20
    single_copy_min_bytes: int = 0

    def __post_init__(self):
        for k in ("call_us", "sync_us", "op_us"):
            _nonneg("shm.", k, getattr(self, k))
        for k in ("copy_cache_GBps", "add_cache_GBps", "copy_dram_GBps", "add_dram_GBps"):
            _positive("shm.", k, getattr(self, k))
        _count("shm.", "cache_bytes", self.cache_bytes, 0)
        _count("shm.", "piece_bytes", self.piece_bytes, 1)
        _count("shm.", "single_copy_min_bytes", self.single_copy_min_bytes, 0)


@dataclass(frozen=True)
class SystemSpec:
    """One node type (``gpus_per_node`` accelerators) and its fabric. See docs/system-description.md."""

    name: str
    gpu: str
    gpus_per_node: int
    intra: str                      # "nvswitch" | "pcie" | "shm" | "full_mesh"
    gpu_link_GBps: float            # per GPU, per direction, into the intra-node fabric
    mem_GBps: float                 # local copy bandwidth (device memory), per GPU
    reduce_GBps: float              # rate at which one GPU reduces incoming data into its buffer
    nics_per_node: int = 0
    nic_GBps: float = 0.0           # per NIC, per direction
    gpus_per_pcie_switch: int = 1   # pcie systems: GPUs sharing one switch uplink
    pcie_uplink_GBps: float = 0.0   # pcie systems: switch <-> CPU, per direction
    nvls: bool = False              # NVSwitch in-switch reduction / multicast
    nvls_alg_GBps: float = 0.0      # NVLS all_reduce algbw on one domain (analytic model)
    nvls_us: float = 0.0            # NVLS latency (analytic model)
    launch_us: float = 0.0          # per collective, on top of protocol base latency
    protocols: tuple[Protocol, ...] = ()
    fabric: Fabric = field(default_factory=Fabric)
    shm: ShmCost | None = None      # shm systems: the runtime's own cost model (cpu_loop.py)
    nccl_version: str = ""          # e.g. "2.21.5" ("" = unknown): NCCL's choices change by version
    sources: dict = field(default_factory=dict, compare=False, hash=False)

    def __post_init__(self):
        if self.intra not in INTRA_KINDS:
            raise ValueError(f"intra must be one of {INTRA_KINDS}, got {self.intra!r}")
        _count("", "gpus_per_node", self.gpus_per_node, 1)
        for k in ("gpu_link_GBps", "mem_GBps", "reduce_GBps"):
            _positive("", k, getattr(self, k))
        _count("", "nics_per_node", self.nics_per_node, 0)
        _count("", "gpus_per_pcie_switch", self.gpus_per_pcie_switch, 1)
        if self.nics_per_node > 0:   # the network is used only when there are NICs
            _positive("", "nic_GBps", self.nic_GBps)
        else:
            _nonneg("", "nic_GBps", self.nic_GBps)
        if self.intra == "pcie":
            _positive("", "pcie_uplink_GBps", self.pcie_uplink_GBps)
        else:
            _nonneg("", "pcie_uplink_GBps", self.pcie_uplink_GBps)
        if not isinstance(self.nvls, bool):
            raise ValueError(f"nvls must be true or false, got {self.nvls!r}")
        if self.intra == "full_mesh":
            # point-to-point links, no switch: nothing to reduce in, no PCIe switch grouping
            if self.gpus_per_node < 2:
                raise ValueError(f"full_mesh needs gpus_per_node >= 2, got {self.gpus_per_node}")
            if self.nvls:
                raise ValueError("nvls (NVSwitch in-switch reduction) needs intra \"nvswitch\"; "
                                 "a full_mesh node has no switch")
            if self.gpus_per_pcie_switch != 1 or self.pcie_uplink_GBps:
                raise ValueError("gpus_per_pcie_switch / pcie_uplink_GBps describe intra "
                                 "\"pcie\" systems; leave them unset for full_mesh")
        if self.nvls:
            _positive("", "nvls_alg_GBps", self.nvls_alg_GBps)
        else:
            _nonneg("", "nvls_alg_GBps", self.nvls_alg_GBps)
        _nonneg("", "nvls_us", self.nvls_us)
        _nonneg("", "launch_us", self.launch_us)
        if not self.protocols:
            raise ValueError(f"system {self.name!r} defines no protocol")
        if not all(isinstance(p, Protocol) for p in self.protocols):
            raise ValueError("protocols must be Protocol entries")
        names = [p.name for p in self.protocols]
        if len(set(n.lower() for n in names)) != len(names):
            raise ValueError(f"protocol names must be unique, got {names}")
        if not isinstance(self.fabric, Fabric):
            raise ValueError("fabric must be a Fabric")
        if not isinstance(self.nccl_version, str) or (
                self.nccl_version and not re.fullmatch(r"\d+(\.\d+)*([-+].*)?",
                                                       self.nccl_version)):
            raise ValueError(f"nccl_version must be a dotted version such as \"2.21.5\" (NCCL's "
                             f"\"2.18.3-1\" or \"2.18.3+cuda12.2\" too), got {self.nccl_version!r}")

    def protocol(self, name: str) -> Protocol:
        """The protocol called ``name`` (case-insensitive); ValueError listing valid ones."""
        for p in self.protocols:
            if p.name.lower() == str(name).lower():
                return p
        raise ValueError(f"{self.name} has no protocol {name!r}; choose from "
                         f"{', '.join(p.name for p in self.protocols)}")

    def with_(self, **changes) -> "SystemSpec":
        """A copy with some fields changed (e.g. fitted parameters)."""
        return replace(self, **changes)

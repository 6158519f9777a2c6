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

from dataclasses import dataclass, field, replace

INTRA_KINDS = ("nvswitch", "pcie", "shm")


@dataclass(frozen=True)
class Protocol:
    """A wire protocol: usable fraction of link bandwidth and its latencies (us)."""

    name: str
    eff: float              # fraction of link bandwidth delivered to payload
    step_intra_us: float    # per step (one hop of a phase) over the intra-node fabric
    step_net_us: float      # per step when the step crosses the network
    base_us: float = 0.0    # once per collective (NCCL baseLat)


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


@dataclass(frozen=True)
class ShmCost:
    """Cost parameters of tilecomm's shared-memory runtime on one host (``sim/cpu_loop.py``).

    A collective costs ``call_us`` (Python per call) + ``sync_us`` per synchronization (handshake,
    one per remote phase and piece) + ``op_us`` per numpy operation + its copied and reduced bytes
    at cache rates when the operation's working set fits in ``cache_bytes``, DRAM rates otherwise. ``piece_bytes`` is the runtime's TILECOMM_PIECE_BYTES (not fitted).
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


@dataclass(frozen=True)
class SystemSpec:
    """One node type (``gpus_per_node`` accelerators) and its fabric. See docs/system-description.md."""

    name: str
    gpu: str
    gpus_per_node: int
    intra: str                      # "nvswitch" | "pcie" | "shm"
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
    sources: dict = field(default_factory=dict, compare=False, hash=False)

    def __post_init__(self):
        if self.intra not in INTRA_KINDS:
            raise ValueError(f"intra must be one of {INTRA_KINDS}, got {self.intra!r}")
        if self.gpus_per_node < 1:
            raise ValueError("gpus_per_node must be >= 1")
        if not self.protocols:
            raise ValueError(f"system {self.name!r} defines no protocol")

    def protocol(self, name: str) -> Protocol:
        for p in self.protocols:
            if p.name == name:
                return p
        raise KeyError(f"{self.name} has no protocol {name!r}; has "
                       f"{', '.join(p.name for p in self.protocols)}")

    def with_(self, **changes) -> "SystemSpec":
        """A copy with some fields changed (e.g. fitted parameters)."""
        return replace(self, **changes)

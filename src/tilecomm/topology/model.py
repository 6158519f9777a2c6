"""Topology: links with capacities, rank placement, and the path (list of links) between ranks.

Links are numbered, not objects, so that a 1,024-node cluster (tens of thousands of links) costs
a few numpy arrays. Each link has a *kind* and an index within the kind; ``link_name(i)`` renders
it (``"nic_tx[3]"``) only when a person needs to read it.

Link kinds (all directed, capacity in GB/s)::

    mem[g]                  local copies and reductions on GPU g
    gpu_tx[g] / gpu_rx[g]   GPU g's port into the node fabric (NVLink to NVSwitch, PCIe x16, or
                            the memory bus for shared-memory ranks)
    mesh[a->b]              full_mesh nodes: the direct link from GPU a to GPU b of the same node
                            (one per ordered pair, ``gpu_link_GBps / (gpus_per_node - 1)`` each)
    sw_up[s] / sw_down[s]   PCIe switch s <-> CPU root complex (pcie systems only)
    nic_tx[n] / nic_rx[n]   NIC n, one per ``gpus_per_node / nics_per_node`` GPUs (with more
                            NICs than GPUs, one port per GPU carrying its NICs' sum)
    leaf_up[l] / leaf_down[l]  aggregated uplinks of leaf switch l (ECMP assumed perfect)
    pod_up[p] / pod_down[p]    aggregated uplinks of spine group p (3-level fabrics)

Paths: same node -> ``gpu_tx, [sw_up, sw_down,] gpu_rx`` (full_mesh: the pair's own
``mesh`` link, nothing shared with any other pair); other node -> ``nic_tx, [leaf_up,
[pod_up, pod_down,] leaf_down,] nic_rx`` (GPUDirect RDMA: the GPU-NIC PCIe hop is faster than
the NIC and is not modeled). With a rail-optimized fabric NIC r of every node hangs off rail r's
leaves; a flow whose endpoints sit on different rails must climb to the spine.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .spec import SystemSpec

NET_KINDS = ("nic_tx", "nic_rx", "leaf_up", "leaf_down", "pod_up", "pod_down")


@dataclass
class Topology:
    """``nodes`` copies of ``spec``'s node with ``gpus`` ranks each, joined by its fabric.

    Rank ``r`` runs on node ``r // gpus``, local GPU ``r % gpus`` (block placement, as torchrun).
    """

    spec: SystemSpec
    nodes: int
    gpus: int

    def __post_init__(self):
        s = self.spec
        if not 1 <= self.gpus <= s.gpus_per_node:
            raise ValueError(f"{s.name}: gpus per node must be in 1..{s.gpus_per_node}, "
                             f"got {self.gpus}")
        if self.nodes < 1:
            raise ValueError("nodes must be >= 1")
        if self.nodes > 1 and s.nics_per_node < 1:
            raise ValueError(f"{s.name} has no NIC: it cannot span {self.nodes} nodes")
        n, g = self.nodes, self.gpus
        self.world_size = n * g
        self.nics = max(1, min(s.nics_per_node, g)) if s.nics_per_node else 0
        # more NICs than GPUs (AWS p5: 32 x 100G for 8 GPUs): each GPU drives its own
        # nics_per_node / gpus_per_node NICs as one port, as NCCL's net plugins stripe a GPU's
        # messages over its NICs; the port carries their sum
        self.nic_GBps = s.nic_GBps * max(1.0, s.nics_per_node / s.gpus_per_node)
        self.switches = -(-g // max(1, s.gpus_per_pcie_switch)) if s.intra == "pcie" else 0
        # full_mesh: every ordered pair of the node's ranks has its own link; each carries the
        # GPU's total over its gpus_per_node - 1 links (spec.INTRA_KINDS), whatever --gpus uses
        self.mesh = s.intra == "full_mesh"
        mesh_links = n * g * (g - 1) if self.mesh else 0
        mesh_bw = s.gpu_link_GBps / max(1, s.gpus_per_node - 1)
        f = s.fabric
        self.rails = self.nics if f.rail_optimized else 1
        nodes_leaf = max(1, f.nodes_per_leaf)
        self.leaves_per_rail = -(-n // nodes_leaf)
        self.leaves = self.rails * self.leaves_per_rail if n > 1 else 0
        self.pods = -(-self.leaves_per_rail // max(1, f.leaves_per_pod)) * self.rails \
            if (n > 1 and f.levels >= 3) else 0
        # Capacities of each kind, in link-index order.
        nic_per_leaf = nodes_leaf * (self.nics // self.rails if self.nics else 0)
        leaf_up_bw = nic_per_leaf * self.nic_GBps / max(f.oversubscription, 1e-9)
        kinds = [
            ("mem", n * g, s.mem_GBps),
            ("gpu_tx", n * g, s.gpu_link_GBps), ("gpu_rx", n * g, s.gpu_link_GBps),
            ("sw_up", n * self.switches, s.pcie_uplink_GBps),
            ("sw_down", n * self.switches, s.pcie_uplink_GBps),
            ("mesh", mesh_links, mesh_bw),
            ("nic_tx", n * self.nics if n > 1 else 0, self.nic_GBps),
            ("nic_rx", n * self.nics if n > 1 else 0, self.nic_GBps),
            ("leaf_up", self.leaves, leaf_up_bw), ("leaf_down", self.leaves, leaf_up_bw),
            ("pod_up", self.pods, leaf_up_bw * f.leaves_per_pod),
            ("pod_down", self.pods, leaf_up_bw * f.leaves_per_pod),
        ]
        self.offset: dict[str, int] = {}
        caps, at = [], 0
        self._kinds = []
        for name, count, bw in kinds:
            self.offset[name] = at
            self._kinds.append((at, count, name))
            caps.append(np.full(count, float(bw)))
            at += count
        self.capacity = np.concatenate(caps)       # GB/s per link
        self.is_net = np.zeros(at, dtype=bool)
        for name in NET_KINDS:
            o = self.offset[name]
            self.is_net[o:o + dict((k, c) for _, c, k in self._kinds)[name]] = True

    # -- placement -------------------------------------------------------------------------
    def node_of(self, rank):
        return np.asarray(rank) // self.gpus

    def local_of(self, rank):
        return np.asarray(rank) % self.gpus

    def link_name(self, link: int) -> str:
        for at, count, name in self._kinds:
            if at <= link < at + count:
                if name == "mesh":
                    a, b = self._mesh_pair(link - at)
                    return f"mesh[{a}->{b}]"
                return f"{name}[{link - at}]"
        raise IndexError(link)

    def _mesh_pair(self, i: int) -> tuple[int, int]:
        """(src, dst) ranks of full-mesh link ``i`` (index within the ``mesh`` kind)."""
        g = self.gpus
        src, j = divmod(i, g - 1)
        sl = src % g
        return src, src - sl + (j if j < sl else j + 1)

    def mesh_link(self, src, dst):
        """Link id(s) of the direct link ``src -> dst`` (same node, ``src != dst``; full_mesh)."""
        src, dst = np.asarray(src, dtype=np.int64), np.asarray(dst, dtype=np.int64)
        sl, dl = src % self.gpus, dst % self.gpus
        return self.offset["mesh"] + src * (self.gpus - 1) + np.where(dl < sl, dl, dl - 1)

    def link_kind(self, link: int) -> str:
        return self.link_name(link).split("[")[0]

    # -- paths -----------------------------------------------------------------------------
    def paths(self, src, dst) -> np.ndarray:
        """Links of the path of each flow ``src[i] -> dst[i]``: an ``(n, 6)`` int array, -1 pad.

        ``src == dst`` is a local copy on ``mem[src]``.
        """
        src = np.atleast_1d(np.asarray(src, dtype=np.int64))
        dst = np.atleast_1d(np.asarray(dst, dtype=np.int64))
        s, o, g = self.spec, self.offset, self.gpus
        out = np.full((len(src), 6), -1, dtype=np.int64)
        local = src == dst
        sn, dn = src // g, dst // g
        intra = (sn == dn) & ~local
        inter = sn != dn
        out[local, 0] = o["mem"] + src[local]
        # Intra-node.
        out[intra, 0] = o["gpu_tx"] + src[intra]
        if self.mesh:
            out[intra, 0] = self.mesh_link(src[intra], dst[intra])
        elif s.intra == "pcie":
            per = max(1, s.gpus_per_pcie_switch)
            ssw, dsw = (src % g) // per, (dst % g) // per
            cross = intra & (ssw != dsw)
            out[cross, 1] = o["sw_up"] + sn[cross] * self.switches + ssw[cross]
            out[cross, 2] = o["sw_down"] + dn[cross] * self.switches + dsw[cross]
            out[intra & ~cross, 1] = o["gpu_rx"] + dst[intra & ~cross]
            out[cross, 3] = o["gpu_rx"] + dst[cross]
        else:
            out[intra, 1] = o["gpu_rx"] + dst[intra]
        if inter.any():
            self._net_paths(src[inter], dst[inter], out, inter)
        return out

    def _net_paths(self, src, dst, out, mask):
        o, g, f = self.offset, self.gpus, self.spec.fabric
        per_nic = -(-g // self.nics)
        snic, dnic = (src % g) // per_nic, (dst % g) // per_nic
        sn, dn = src // g, dst // g
        rows = np.full((len(src), 6), -1, dtype=np.int64)
        rows[:, 0] = o["nic_tx"] + sn * self.nics + snic
        srail = snic if f.rail_optimized else np.zeros_like(snic)
        drail = dnic if f.rail_optimized else np.zeros_like(dnic)
        sleaf = srail * self.leaves_per_rail + sn // max(1, f.nodes_per_leaf)
        dleaf = drail * self.leaves_per_rail + dn // max(1, f.nodes_per_leaf)
        up = sleaf != dleaf
        rows[up, 1] = o["leaf_up"] + sleaf[up]
        col = np.where(up, 2, 1)
        if self.pods:
            lpp = max(1, f.leaves_per_pod)
            spod = srail * -(-self.leaves_per_rail // lpp) + (sleaf % self.leaves_per_rail) // lpp
            dpod = drail * -(-self.leaves_per_rail // lpp) + (dleaf % self.leaves_per_rail) // lpp
            core = up & (spod != dpod)
            rows[core, 2] = o["pod_up"] + spod[core]
            rows[core, 3] = o["pod_down"] + dpod[core]
            col = np.where(core, 4, col)
        idx = np.arange(len(src))
        rows[idx[up], col[up]] = o["leaf_down"] + dleaf[up]
        col = np.where(up, col + 1, col)
        rows[idx, col] = o["nic_rx"] + dn * self.nics + dnic
        out[mask] = rows

    def path(self, src: int, dst: int) -> list[str]:
        """Readable path of one flow, e.g. ``['gpu_tx[0]', 'gpu_rx[3]']``."""
        return [self.link_name(int(i)) for i in self.paths([src], [dst])[0] if i >= 0]

    def crosses_net(self, paths: np.ndarray) -> np.ndarray:
        """Per flow: does its path use a network link?"""
        safe = np.where(paths >= 0, paths, 0)
        return (self.is_net[safe] & (paths >= 0)).any(axis=1)

"""Time of a KV-cache transfer from the engine's own schedule (``tilecomm model --mode serve``).

What is timed is what :mod:`.transfer` moves: the list ``transfers(coalesce(src, dst), layers)``
of :mod:`.schedule`, one contiguous move per (layer, K/V, run) of ``run.n * block_bytes`` bytes
(one shared-memory copy inside a host, one message across hosts). Nothing here re-derives how
many moves a request makes or how big they are.

NOTE [cost of a push on its NICs]
    A push's transfers are posted without waiting for each other (``KVTransfer._send_remote``
    posts every message of a push, then returns), so posting one transfer overlaps the wire time
    of the ones before it: on one NIC a transfer costs ``max(overhead_us, bytes / GBps)`` (the
    gap of LogGP, Alexandrov et al. 1995) and a NIC's transfers follow one another. A push
    costs ``latency_us`` once (its first message's latency) plus the busiest NIC's sum.
    ``pushes`` identical pushes (the TP ranks of a prefill group, each its heads' share; the
    ranks of other replicas on the node) run at once over ``nics`` NICs: with at least as many
    NICs as pushes each push spreads its transfers round-robin over its own NICs (a rank of
    tilecomm's engine uses one; Mooncake's engine stripes one request over several); with
    fewer, ``ceil(pushes / nics)`` pushes share the busiest NIC.

NOTE [link parameters: from the system description, one assumption]
    ``GBps`` is the system's ``nic_GBps`` (per NIC, per direction: presets.py cites each, e.g.
    48.5 achievable on ConnectX-7 400G, nccl-tests#175; 24.5 on ConnectX-6 200G). NCCL's protocol
    efficiency, which the simulator applies to a send_recv, is not applied: the engine's moves
    are plain messages (RDMA writes on a GPU system), not NCCL's LL/LL128/Simple channels.
    ``latency_us`` is the system's one-message cross-node latency as the simulator charges it
    for the smallest send_recv: ``launch_us`` + the lowest ``base_us + step_net_us`` of its
    protocols (14.8 us on the GPU presets). ``overhead_us`` per transfer is an ASSUMPTION,
    :data:`DESCRIPTOR_US`: no system description gives it and it is not measured here.
    Contiguous layouts do not depend on it (each transfer's wire time is longer); fragmented
    ones scale with it (docs/model.md, "KV-cache transfer (serve mode) against Mooncake").
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

import numpy as np

from .schedule import CacheGeometry, Transfer, coalesce, transfers

#: ASSUMPTION (NOTE [link parameters]): microseconds to post one transfer (an RDMA work
#: request) and reap its completion, per NIC queue. An order of magnitude for a software
#: transfer engine, not measured and not from a specification.
DESCRIPTOR_US = 1.0


@dataclass(frozen=True)
class KVLink:
    """The links a request's pushes use: ``latency_us`` once per push, ``overhead_us`` per
    transfer, ``GBps`` per NIC and direction, ``nics`` NICs used in parallel."""

    latency_us: float
    overhead_us: float
    GBps: float
    nics: int = 1

    def __post_init__(self):
        for k in ("latency_us", "overhead_us"):
            v = getattr(self, k)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not v >= 0:
                raise ValueError(f"KVLink: {k} must be a number >= 0, got {v!r}")
        if isinstance(self.GBps, bool) or not isinstance(self.GBps, (int, float)) or \
                not self.GBps > 0 or math.isinf(self.GBps):
            raise ValueError(f"KVLink: GBps must be a finite number > 0, got {self.GBps!r}")
        if isinstance(self.nics, bool) or not isinstance(self.nics, int) or self.nics < 1:
            raise ValueError(f"KVLink: nics must be an int >= 1, got {self.nics!r}")

    @classmethod
    def from_system(cls, system, nics: int | None = None,
                    overhead_us: float = DESCRIPTOR_US) -> "KVLink":
        """The cross-node link of ``system`` (a preset name, a .json path or a SystemSpec),
        NOTE [link parameters]; ``nics`` defaults to the node's NIC count."""
        from tilecomm.topology import SystemSpec, load_system
        spec = system if isinstance(system, SystemSpec) else load_system(system)
        if spec.nics_per_node < 1:
            raise ValueError(f"system {spec.name!r} has no NICs: nothing crosses nodes")
        latency = spec.launch_us + min(p.base_us + p.step_net_us for p in spec.protocols)
        return cls(latency, overhead_us, spec.nic_GBps,
                   spec.nics_per_node if nics is None else nics)


@dataclass(frozen=True)
class KVTime:
    """Predicted time of ``pushes`` parallel pushes of one schedule (NOTE [cost of a push])."""

    seconds: float
    transfers_per_push: int     # len(transfers(coalesce(src, dst), layers))
    pushes: int
    bytes_per_push: int
    busiest_nic_us: float       # the busiest NIC's transfers, without the push latency
    overhead_bound: bool        # posting, not the wire, set the busiest NIC's time

    @property
    def transfers(self) -> int:
        """Transfers of all pushes together."""
        return self.transfers_per_push * self.pushes

    @property
    def nbytes(self) -> int:
        return self.bytes_per_push * self.pushes

    @property
    def GBps(self) -> float:
        """Bytes of all pushes over the time (Mooncake's and DeepEP's convention)."""
        return self.nbytes / self.seconds / 1e9 if self.seconds > 0 else math.inf


def transfer_bytes(t: Transfer, geometry: CacheGeometry) -> int:
    """Bytes of one transfer: ``t.run.n`` blocks of one layer's K (or V) of ``geometry``."""
    return t.run.n * geometry.block_bytes


def block_layout(nblocks: int, run_blocks: float | None = None) -> tuple[list[int], list[int]]:
    """Source and destination ids of a request of ``nblocks`` blocks whose coalesced runs are
    ``run_blocks`` long on average (``None``: contiguous on both sides, one run).

    ``ceil(nblocks / run_blocks)`` runs of lengths differing by at most one; the source ids are
    ``0 .. nblocks-1``, the destination places the runs in reverse order, so consecutive runs
    never join (a permutation of the same ids, within any cache of ``nblocks`` blocks).
    """
    if isinstance(nblocks, bool) or not isinstance(nblocks, int) or nblocks < 1:
        raise ValueError(f"nblocks must be an int >= 1, got {nblocks!r}")
    src = list(range(nblocks))
    if run_blocks is None:
        return src, list(src)
    if isinstance(run_blocks, bool) or not isinstance(run_blocks, (int, float)) or \
            not run_blocks >= 1 or math.isinf(run_blocks):
        raise ValueError(f"run_blocks must be a finite number >= 1 (blocks per contiguous run) "
                         f"or None (contiguous), got {run_blocks!r}")
    nruns = min(nblocks, math.ceil(nblocks / run_blocks))
    q, r = divmod(nblocks, nruns)
    lengths = [q + (k < r) for k in range(nruns)]
    dst: list[int] = []
    end = nblocks
    for n in lengths:                      # run k lands just below run k-1
        dst.extend(range(end - n, end))
        end -= n
    return src, dst


def push_time(geometry: CacheGeometry, src_ids: Sequence[int], dst_ids: Sequence[int],
              link: KVLink, layers: int | Sequence[int] | None = None,
              pushes: int = 1) -> KVTime:
    """Time of ``pushes`` parallel pushes, each moving ``src_ids`` to ``dst_ids`` for ``layers``
    (a count from 0, a sequence of layer ids, default all of ``geometry``'s) of a cache of
    ``geometry`` (one sending rank's share of heads), over ``link`` (NOTE [cost of a push])."""
    if isinstance(pushes, bool) or not isinstance(pushes, int) or pushes < 1:
        raise ValueError(f"pushes must be an int >= 1, got {pushes!r}")
    if layers is None:
        layers = range(geometry.layers)
    elif isinstance(layers, int) and not isinstance(layers, bool):
        layers = range(layers)
    moves = transfers(coalesce(src_ids, dst_ids), layers)
    if not moves:
        raise ValueError("the push moves nothing (no layers or no blocks)")
    nbytes = np.array([transfer_bytes(t, geometry) for t in moves], dtype=np.float64)
    wire = nbytes / (link.GBps * 1e3)                      # us (1 GB/s = 1e3 bytes/us)
    cost = np.maximum(link.overhead_us, wire)
    if link.nics >= pushes:                                # own NICs: the push with fewest
        per = link.nics // pushes
        nic = np.bincount(np.arange(len(moves)) % per, weights=cost, minlength=per)
        k = int(np.argmax(nic))
        busiest = float(nic[k])
        mine = np.arange(len(moves)) % per == k
    else:                                                  # shared NICs
        busiest = math.ceil(pushes / link.nics) * float(cost.sum())
        mine = np.ones(len(moves), dtype=bool)
    posted = mine & (wire < link.overhead_us)
    over = float(cost[posted].sum()) > 0.5 * float(cost[mine].sum())
    return KVTime((link.latency_us + busiest) * 1e-6, len(moves), pushes, int(nbytes.sum()),
                  busiest, over)


def request_time(geometry: CacheGeometry, nblocks: int, link: KVLink,
                 run_blocks: float | None = None, layers: int | Sequence[int] | None = None,
                 pushes: int = 1) -> KVTime:
    """:func:`push_time` of a request of ``nblocks`` blocks laid out as :func:`block_layout`
    (contiguous, or runs of ``run_blocks`` blocks on average)."""
    src, dst = block_layout(nblocks, run_blocks)
    return push_time(geometry, src, dst, link, layers, pushes)

"""Closed-form (alpha-beta) costs.

``alpha`` is the per-step latency (us), ``B`` the per-flow bandwidth (bytes/us), ``S`` the
message size in bytes (nccl-tests convention, see flowsched.py), ``n`` ranks. These are exact for
the flow model when every step's flows are uncontended and identical (e.g. a ring on uniform
links); tests check them against the simulator.

    ring all_reduce        2(n-1) (alpha + S/(nB))
    ring all_gather / reduce_scatter      (n-1) (alpha + S/(nB))
    one_shot all_reduce    alpha + (n-1) S / B            (all peers read through one port)
    two_shot all_reduce    2 alpha + 2 (n-1)/n S / B
    recursive doubling     log2(n) (alpha + S/B)
    rhd (Rabenseifner)     2 log2(n) alpha + 2 (n-1)/n S / B
    binomial tree bcast    ceil(log2 n) (alpha + S/B)
    bruck all_to_all       ceil(log2 n) (alpha + S/(2B))  (power-of-two n)
    pairwise all_to_all    (n-1) (alpha + S/(nB))
    double binary tree     2 depth alpha + S / (0.46 B)   (NCCL tuning.cc: tree busBw*.92, algBw = busBw/2)
    NVLS all_reduce        nvls_us + S / nvls_alg_bw      (in-switch reduction; analytic only)

:func:`alpha_beta` evaluates any :class:`FlowSchedule` the same way without contention:
``sum over steps of max over flows (alpha_f + bytes_f / bw_f)``.
"""

from __future__ import annotations

import math

import numpy as np

from tilecomm.topology import Protocol, Topology

from .flowsched import FlowSchedule

GB = 1e3


def closed_form(collective: str, algo: str, n: int, S: float, alpha: float, B: float) -> float:
    """Time (us) of ``collective``/``algo`` by its closed form, without fixed overheads."""
    lg = math.ceil(math.log2(n)) if n > 1 else 0
    key = (collective, algo)
    if n == 1:
        return 0.0
    if key == ("all_reduce", "ring"):
        return 2 * (n - 1) * (alpha + S / (n * B))
    if key in (("all_gather", "ring"), ("reduce_scatter", "ring")):
        return (n - 1) * (alpha + S / (n * B))
    if key == ("all_reduce", "one_shot"):
        return alpha + (n - 1) * S / B
    if key == ("all_reduce", "two_shot"):
        return 2 * alpha + 2 * (n - 1) / n * S / B
    if key == ("all_reduce", "recursive_doubling"):
        return lg * (alpha + S / B)
    if key == ("all_reduce", "rhd"):
        return 2 * lg * alpha + 2 * (n - 1) / n * S / B
    if key in (("broadcast", "tree"), ("reduce", "tree")):
        return lg * (alpha + S / B)
    if key == ("all_to_all", "bruck"):
        return lg * (alpha + S / (2 * B))
    if key == ("all_to_all", "pairwise"):
        return (n - 1) * (alpha + S / (n * B))
    if key == ("all_reduce", "dbtree"):
        return 2 * lg * alpha + S / (0.46 * B)
    raise KeyError(f"no closed form for {collective}/{algo}")


def alpha_beta(fs: FlowSchedule, topo: Topology, proto: Protocol, nbytes: float) -> float:
    """Uncontended lockstep cost of a flow schedule, plus launch and protocol base latency."""
    cap = topo.capacity * GB * proto.eff
    red = topo.spec.reduce_GBps * GB
    total = topo.spec.launch_us + proto.base_us
    for ph in fs.phases:
        paths = topo.paths(ph.src, ph.dst)
        bw = np.where(paths >= 0, cap[np.where(paths >= 0, paths, 0)], np.inf).min(axis=1)
        bw = np.where(ph.reduce, np.minimum(bw, red), bw)
        net = topo.crosses_net(paths)
        alpha = np.where(ph.src == ph.dst, 0.0, np.where(net, proto.step_net_us,
                                                         proto.step_intra_us))
        total += ph.repeat * float((alpha + ph.frac * nbytes / bw).max(initial=0.0))
    return total


def nvls_time(topo: Topology, nbytes: float) -> float:
    """NVLS all_reduce within one NVLink domain (analytic model; see presets for sources)."""
    s = topo.spec
    return s.launch_us + s.nvls_us + nbytes / (s.nvls_alg_GBps * GB)


def dbtree_time(topo: Topology, proto: Protocol, nbytes: float) -> float:
    """Double binary tree all_reduce, NCCL-style: chain inside nodes, trees across nodes."""
    s = topo.spec
    intra_hops = topo.gpus - 1
    inter_hops = math.ceil(math.log2(topo.nodes)) if topo.nodes > 1 else 0
    lat = 2 * (intra_hops * proto.step_intra_us + inter_hops * proto.step_net_us)
    bw = s.gpu_link_GBps if topo.nodes == 1 else min(
        s.gpu_link_GBps, topo.nic_GBps * topo.nics / topo.gpus)
    bw = min(bw * proto.eff, s.reduce_GBps)
    return s.launch_us + proto.base_us + lat + nbytes / (0.46 * bw * GB)

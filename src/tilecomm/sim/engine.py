"""Time a :class:`~tilecomm.sim.flowsched.FlowSchedule` on a topology.

Two engines share one cost model (NOTE [cost of a step]):

* :func:`simulate_events` is exact for the flow-level model: an event queue ordered by
  ``(time, seq)`` releases each rank's phase when the ranks it waits for (schedule.py's NOTE
  [synchronization rule]) have finished the previous phase; active flows share links max-min
  fairly, re-solved at every arrival and departure. Cost ~ O(flows x active flows).
* :func:`simulate_phases` is the scale engine: it solves max-min sharing once per distinct phase
  (assuming the flows of a phase overlap, exact when ranks are in step), then propagates per-rank
  start times through the same waits with numpy, once per step. Cost ~ O(distinct phases x
  flows + steps x ranks); an 8,192-rank ring (16,382 steps) takes about a second.

NOTE [cost of a step]
    A rank's phase starts when its waits are met; after the protocol's step latency (network or
    intra-node, whichever its flows cross) its flows move ``frac * nbytes`` bytes at their max-min
    fair rate over links of capacity ``bw * protocol.eff``; a reducing flow is also capped by the
    destination's reduction throughput (reductions are fused into the copy, as in NCCL). A phase
    in which a rank moves nothing costs it nothing. The collective costs ``launch_us +
    protocol.base_us`` plus the time at which the slowest rank finishes.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass, field

import numpy as np

from tilecomm.topology import Protocol, Topology

from .flowsched import FlowPhase, FlowSchedule
from .maxmin import max_min_rates

GB = 1e3  # bytes per microsecond in one GB/s


@dataclass
class SimResult:
    time_us: float
    bottleneck: str                    # link kind that bounded the slowest flows longest
    time_by_kind: dict = field(default_factory=dict)  # us the slowest flow spent per link kind
    engine: str = ""
    steps: int = 0
    flows: int = 0


@dataclass
class _Prepared:
    paths: np.ndarray
    nbytes: np.ndarray
    caps: np.ndarray
    alpha: np.ndarray


def _prepare(ph: FlowPhase, topo: Topology, proto: Protocol, nbytes: float) -> _Prepared:
    paths = topo.paths(ph.src, ph.dst)
    net = topo.crosses_net(paths)
    alpha = np.where(ph.src == ph.dst, 0.0, np.where(net, proto.step_net_us, proto.step_intra_us))
    caps = np.where(ph.reduce, topo.spec.reduce_GBps * GB, np.inf)
    return _Prepared(paths, ph.frac * nbytes, caps, alpha)


def _capacity(topo: Topology, proto: Protocol) -> np.ndarray:
    return topo.capacity * GB * proto.eff


def _kind(topo: Topology, link: int) -> str:
    return "reduce" if link < 0 else topo.link_kind(int(link))


def _overhead(topo: Topology, proto: Protocol) -> float:
    return topo.spec.launch_us + proto.base_us


def simulate_phases(fs: FlowSchedule, topo: Topology, proto: Protocol,
                    nbytes: float) -> SimResult:
    """Scale engine: per-phase max-min sharing, per-rank start times (see module doc)."""
    w = fs.world_size
    cap = _capacity(topo, proto)
    fin = np.zeros(w)
    by_kind: dict[str, float] = {}
    prev = None
    for ph in fs.phases:
        p = _prepare(ph, topo, proto, nbytes)
        rates, bott = max_min_rates(p.paths, cap, p.caps)
        dur = p.alpha + np.divide(p.nbytes, rates, out=np.zeros_like(rates), where=rates > 0)
        d = np.zeros(w)
        np.maximum.at(d, ph.dst, dur)
        worst = int(np.argmax(dur)) if len(dur) else -1
        remote = ph.src != ph.dst
        rs, rd = ph.src[remote], ph.dst[remote]
        for _ in range(ph.repeat):
            start = fin.copy()
            np.maximum.at(start, rd, fin[rs])                 # read after write
            if prev is not None:
                np.maximum.at(start, prev[0], fin[prev[1]])   # write after read
            fin = start + d
            prev = (rs, rd)
        if worst >= 0:
            k = _kind(topo, bott[worst])
            by_kind[k] = by_kind.get(k, 0.0) + float(dur[worst]) * ph.repeat
    total = _overhead(topo, proto) + float(fin.max(initial=0.0))
    return SimResult(total, max(by_kind, key=by_kind.get) if by_kind else "none", by_kind,
                     "phases", fs.num_steps, fs.num_flows())


def simulate_events(fs: FlowSchedule, topo: Topology, proto: Protocol,
                    nbytes: float, max_flows: int = 200_000) -> SimResult:
    """Exact event-driven flow simulation (see module doc). Refuses more than ``max_flows``."""
    if fs.num_flows() > max_flows:
        raise ValueError(f"{fs.num_flows()} flows exceed max_flows={max_flows}; "
                         "use the phase engine (engine='phases'; CLI: --engine phases)")
    w, cap = fs.world_size, _capacity(topo, proto)
    phases = fs.expanded()
    cache: dict[int, _Prepared] = {}
    prep = []
    for ph in phases:
        if id(ph) not in cache:
            cache[id(ph)] = _prepare(ph, topo, proto, nbytes)
        prep.append(cache[id(ph)])
    nph = len(phases)
    if not nph:   # nothing moves (a barrier's schedule): the fixed overhead, as simulate_phases
        return SimResult(_overhead(topo, proto), "none", {}, "events", 0, 0)
    # Waits of (rank, phase) on phase - 1, per the synchronization rule.
    need = np.zeros((nph, w), dtype=np.int64)
    dependents: list[list[list[int]]] = [[[] for _ in range(w)] for _ in range(nph)]
    for pi, ph in enumerate(phases):
        if pi == 0:
            continue
        waits = [{r} for r in range(w)]
        for s, d in zip(ph.src.tolist(), ph.dst.tolist()):
            waits[d].add(s)
        pp = phases[pi - 1]
        for s, d in zip(pp.src.tolist(), pp.dst.tolist()):
            if s != d:
                waits[s].add(d)
        for r, ws in enumerate(waits):
            need[pi, r] = len(ws)
            for q in ws:
                dependents[pi - 1][q].append(r)
    flows_of = []
    for pi, ph in enumerate(phases):
        per = [[] for _ in range(w)]
        for i, d in enumerate(ph.dst.tolist()):
            per[d].append(i)
        flows_of.append(per)
    heap: list = []
    seq = 0
    for r in range(w):
        heapq.heappush(heap, (0.0, seq, "ready", (0, r)))
        seq += 1
    pending = {}
    active: list[list] = []   # [task, remaining bytes, path, cap]
    now, fin_max = 0.0, 0.0
    by_kind: dict[str, float] = {}
    rates = bott = None

    def complete(task, t):
        nonlocal seq, fin_max
        pi, r = task
        fin_max = max(fin_max, t)
        if pi + 1 < nph:
            for q in dependents[pi][r]:
                need[pi + 1, q] -= 1
                if need[pi + 1, q] == 0:
                    heapq.heappush(heap, (t, seq, "ready", (pi + 1, q)))
                    seq += 1

    dirty = True
    while heap or active:
        if active and dirty:
            rates, bott = max_min_rates(np.array([a[2] for a in active]), cap,
                                        np.array([a[3] for a in active]))
            dirty = False
        t_done = np.inf
        if active:
            rem = np.array([a[1] for a in active])
            t_done = now + float((rem / rates).min())
        t_ev = heap[0][0] if heap else np.inf
        t = min(t_done, t_ev)
        if active and t > now:
            slow = int(np.argmin(rates))
            k = _kind(topo, bott[slow])
            by_kind[k] = by_kind.get(k, 0.0) + (t - now)
            for a, rate in zip(active, rates):
                a[1] -= rate * (t - now)
        now = t
        if t_done <= t_ev:
            keep = []
            for a in active:
                if a[1] <= 1e-6 * max(1.0, nbytes):
                    pending[a[0]] -= 1
                    if pending[a[0]] == 0:
                        complete(a[0], now)
                else:
                    keep.append(a)
            active, dirty = keep, True
            continue
        _, _, kind, task = heapq.heappop(heap)
        pi, r = task
        idx = flows_of[pi][r]
        p = prep[pi]
        if kind == "ready":
            if not idx:
                complete(task, now)
                continue
            alpha = float(p.alpha[idx].max())
            heapq.heappush(heap, (now + alpha, seq, "start", task))
            seq += 1
        else:
            pending[task] = len(idx)
            for i in idx:
                active.append([task, float(p.nbytes[i]), p.paths[i], p.caps[i]])
            dirty = True
            zero = [a for a in active if a[1] <= 0]
            if zero:
                active = [a for a in active if a[1] > 0]
                for a in zero:
                    pending[a[0]] -= 1
                    if pending[a[0]] == 0:
                        complete(a[0], now)
    total = _overhead(topo, proto) + fin_max
    return SimResult(total, max(by_kind, key=by_kind.get) if by_kind else "none", by_kind,
                     "events", fs.num_steps, fs.num_flows())


def simulate(fs: FlowSchedule, topo: Topology, proto: Protocol, nbytes: float,
             engine: str = "auto", event_limit: int = 20_000) -> SimResult:
    """``engine``: 'events', 'phases', or 'auto' (events up to ``event_limit`` flows)."""
    if engine == "events" or (engine == "auto" and fs.num_flows() <= event_limit):
        return simulate_events(fs, topo, proto, nbytes)
    return simulate_phases(fs, topo, proto, nbytes)

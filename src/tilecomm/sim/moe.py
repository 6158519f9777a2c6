"""MoE expert-parallel dispatch and combine on a modeled topology (``tilecomm sim moe``).

What moves comes from :mod:`tilecomm.moe.routing` (the one definition every engine uses): on a
synthetic routing (seeded, uniform over experts, optionally skewed or node-limited), per source
rank ``s``, ``routing.traffic`` gives ``counts[s][r]`` (rows ``s`` sends to rank ``r``: a token
is sent once to each rank owning at least one of its top-k experts) and ``host_rows[s][h]``
(tokens of ``s`` with an expert on host ``h``). From those, per (src, dst) GPU pair:

normal mode (DeepEP's normal kernels; tilecomm's hosts engine, ``moe/hosts.py``)
    same host: ``s -> r`` over the node fabric, ``counts[s][r]`` rows (``s == r``: a copy in
    ``s``'s memory). Other host ``B``: the token crosses the network once, ``s -> p`` with
    ``p = partner(s, B)`` (the rank of ``B`` with ``s``'s local rank: its rail partner),
    ``host_rows[s][B]`` rows; then ``p -> r`` over the node fabric, ``counts[s][r]`` rows, for
    every rank ``r`` of ``B`` (``p == r``: a copy in ``p``'s memory). Combine is the reverse
    with 16-bit rows: ``r -> p`` partials summed at ``p``, one partial per (token, host) back
    ``p -> s``, summed at ``s`` (every combine flow reduces into its destination).
low_latency mode (DeepEP's low-latency kernels)
    no de-duplication: one message per (token, selected expert), straight ``s -> owner``
    over whatever path the topology has (NVLink inside a node, the NICs across nodes).

Row bytes: ``hidden * 2`` (bf16) or, with ``fp8``, ``hidden + ceil(hidden / 128) * 4`` (e4m3
plus one float32 scale per 128 channels); combine rows are bf16. Low-latency dispatch messages
carry 16 more bytes (DeepEP test_low_latency.py counts ``hidden + hidden / 128 * 4 + 16``).

Timing: all flows of a phase run concurrently (DeepEP pipelines the RDMA and NVLink stages in
chunks; the hosts engine's forward waits for the network, so this is optimistic for it) and
share links max-min fairly in the simulator's flow engine (:mod:`.engine`): link capacity x
the protocol's efficiency, each rank's flows start after one step latency. Fixed per call:
``launch_us + protocol.base_us`` (the engine's overhead). All parameters come from the system
preset; the protocol is ``Simple`` unless told otherwise (DeepEP moves plain rows with
per-chunk flags, not NCCL's LL/LL128 lines). Nothing here is fitted.

GB/s as DeepEP reports it (deepseek-ai/DeepEP tests/test_intranode.py, test_internode.py,
test_low_latency.py), for rank 0, over the simulated time of the slowest rank:

* NVL (one node, normal): the rows rank 0 *receives* (from every source, itself included) x
  row bytes; combine: the same rows in bf16 (what it sends back).
* RDMA (several nodes, normal): rank 0's tokens x the number of distinct destination *nodes*
  of each, its own node included, x row bytes; combine: the same in bf16.
* low-latency: rank 0's (token, expert) selections x message bytes (dispatch), x ``hidden*2``
  (combine).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field

import numpy as np
import torch

from tilecomm.moe import routing
from tilecomm.topology import SystemSpec, Topology, build

from .engine import GB, simulate
from .flowsched import FlowPhase, FlowSchedule

MODES = ("normal", "low_latency")
LL_HEADER_BYTES = 16


def row_bytes(hidden: int, fp8: bool = False) -> int:
    """Bytes of one dispatched row: bf16, or fp8 e4m3 + a float32 scale per 128 channels."""
    return hidden + math.ceil(hidden / 128) * 4 if fp8 else hidden * 2


@dataclass(frozen=True)
class MoeTraffic:
    """One dispatch, per source rank: ``counts[s][r]`` rows to rank ``r``, ``host_rows[s][h]``
    tokens to host ``h`` (routing.Traffic), ``selections[s][r]`` (token, expert) pairs whose
    expert rank ``r`` owns. Floats when it is an expectation (:func:`expected_traffic`)."""
    counts: np.ndarray        # [W, W]
    host_rows: np.ndarray     # [W, H]
    selections: np.ndarray    # [W, W]
    tokens: int
    host_of: tuple[int, ...]


def synthetic_topk(world: int, tokens: int, topk: int, experts: int, seed: int = 0,
                   skew: float = 0.0, topk_groups: int | None = None,
                   host_of: list[int] | None = None) -> list[torch.Tensor]:
    """Every rank's ``[tokens, topk]`` routing, seeded. Uniform over experts by default
    (:func:`routing.random_topk`). ``skew > 0``: expert ``e`` is chosen with weight
    ``(1 + rank_e) ** -skew`` (Zipf; ``rank_e`` a seeded permutation of the experts, so hot
    experts land on random ranks), sampled without replacement (Efraimidis-Spirakis keys).
    ``topk_groups``: node-limited routing as DeepSeek-V3 / DeepEP's test_internode.py: the
    experts are split into one group per host, a token picks the ``topk_groups`` groups with
    the highest best score and its top-k experts inside them."""
    routing.experts_per_rank(experts, world)
    if topk > experts:
        raise ValueError(f"topk ({topk}) is larger than experts ({experts})")
    g = torch.Generator().manual_seed(seed)
    hosts = sorted(set(host_of)) if host_of else [0]
    limit = topk_groups is not None and 0 < topk_groups < len(hosts)
    if limit and topk > topk_groups * (experts // len(hosts)):
        raise ValueError(f"topk ({topk}) exceeds the experts of {topk_groups} groups")
    if skew < 0:
        raise ValueError(f"skew must be >= 0, got {skew}")
    weight = None
    if skew > 0:
        perm = torch.randperm(experts, generator=g)
        weight = (1.0 + perm.to(torch.float64)) ** -skew
    out = []
    for _ in range(world):
        if weight is None and not limit:
            out.append(routing.random_topk(tokens, topk, experts, g))
            continue
        u = torch.rand((tokens, experts), generator=g)
        keys = u.clamp_min(1e-300).log() / weight if weight is not None else u
        if limit:
            per = keys.view(tokens, len(hosts), -1).amax(-1)
            sel = per.topk(topk_groups, dim=1).indices
            keep = torch.zeros((tokens, len(hosts)), dtype=torch.bool)
            keep.scatter_(1, sel, True)
            keys = torch.where(keep.repeat_interleave(experts // len(hosts), 1), keys,
                               torch.full_like(keys, -math.inf))
        out.append(keys.topk(topk, dim=1).indices.to(torch.int64))
    return out


def traffic_of(topk_by_rank: list[torch.Tensor], experts: int, host_of: list[int]
               ) -> MoeTraffic:
    """The traffic of one dispatch, from :func:`routing.traffic` (rows per rank and per host)
    and the selections per owner rank (low-latency mode)."""
    w = len(topk_by_rank)
    t = routing.traffic(topk_by_rank, experts, host_of)
    el = routing.experts_per_rank(experts, w)
    sel = np.zeros((w, w))
    for s, idx in enumerate(topk_by_rank):
        own = idx[idx >= 0] // el
        sel[s] = torch.bincount(own, minlength=w).numpy()
    return MoeTraffic(np.asarray(t.counts, float), np.asarray(t.host_rows, float), sel,
                      int(topk_by_rank[0].shape[0]), tuple(host_of))


def _p_none(experts: int, topk: int, owned: int) -> float:
    """P(no one of ``topk`` distinct uniform experts of ``experts`` is among ``owned``)."""
    if owned >= experts:
        return 0.0
    return math.exp(math.lgamma(experts - owned + 1) - math.lgamma(experts - owned - topk + 1)
                    - math.lgamma(experts + 1) + math.lgamma(experts - topk + 1)) \
        if experts - owned >= topk else 0.0


def expected_traffic(world: int, per_host: int, tokens: float, topk: int, experts: int
                     ) -> MoeTraffic:
    """The expectation of :func:`traffic_of` under uniform routing (``topk`` distinct experts
    uniform over ``experts``): a token reaches a rank with ``1 - C(E-El, K)/C(E, K)`` and a
    host of ``G`` ranks with ``1 - C(E-G*El, K)/C(E, K)``; each rank owns ``K/W`` of its
    selections. Deterministic: what ``tilecomm model`` charges."""
    el = routing.experts_per_rank(experts, world)
    if world % per_host:
        raise ValueError(f"world ({world}) must be a multiple of per_host ({per_host})")
    hosts = world // per_host
    host_of = tuple(r // per_host for r in range(world))
    p_rank = 1.0 - _p_none(experts, topk, el)
    p_host = 1.0 - _p_none(experts, topk, el * per_host)
    return MoeTraffic(np.full((world, world), tokens * p_rank),
                      np.full((world, hosts), tokens * p_host),
                      np.full((world, world), tokens * topk / world), int(round(tokens)),
                      host_of)


def flows(tr: MoeTraffic, gpus: int, phase: str, mode: str, rb: float
          ) -> dict[tuple[int, int], float]:
    """Bytes per (src, dst) GPU pair of one ``phase`` (``dispatch``/``combine``) with rows of
    ``rb`` bytes (see the module docstring). ``gpus``: ranks per host (block placement)."""
    w = len(tr.counts)
    out: dict[tuple[int, int], float] = {}

    def add(a: int, b: int, n: float) -> None:
        if n > 0:
            key = (a, b) if phase == "dispatch" else (b, a)
            out[key] = out.get(key, 0.0) + n

    if mode == "low_latency":
        for s in range(w):
            for r in range(w):
                add(s, r, tr.selections[s][r] * rb)
        return out
    hosts = sorted(set(tr.host_of))
    for s in range(w):
        hs, loc = tr.host_of[s], s % gpus
        for hi, b in enumerate(hosts):
            if b == hs:
                for r in range(b * gpus, (b + 1) * gpus):
                    add(s, r, tr.counts[s][r] * rb)
                continue
            p = b * gpus + loc % gpus
            add(s, p, tr.host_rows[s][hi] * rb)          # one crossing per destination host
            for r in range(b * gpus, (b + 1) * gpus):
                add(p, r, tr.counts[s][r] * rb)          # fan-out inside the host
    return out


@dataclass
class PhaseResult:
    phase: str
    time_us: float
    counted_bytes: float     # rank 0's bytes as DeepEP counts them (see ``counted_as``)
    counted_as: str          # "NVL" | "RDMA" | "LL"
    GBps: float              # counted_bytes / time
    nvl_GBps: float | None   # internode normal mode: DeepEP's secondary NVL figure
    bottleneck: str          # link kind that bounded the slowest flows longest (engine)
    busiest_link: str        # the link with the most load / capacity
    busiest_us: float        # that link's bytes / (capacity x efficiency)
    fixed_us: float          # launch + protocol base latency
    flows: int
    link_bytes: dict = field(default_factory=dict)   # bytes per link kind, all ranks


@dataclass
class MoePrediction:
    system: str
    nodes: int
    gpus: int
    world: int
    tokens: int
    hidden: int
    topk: int
    experts: int
    fp8: bool
    mode: str
    protocol: str
    routing: str
    dispatch: PhaseResult
    combine: PhaseResult

    def as_dict(self) -> dict:
        return asdict(self)


def _counted(tr: MoeTraffic, phase: str, mode: str, rb: float, nodes: int) -> tuple[float, str]:
    if mode == "low_latency":
        return float(tr.selections[0].sum()) * rb, "LL"
    if nodes > 1:
        return float(tr.host_rows[0].sum()) * rb, "RDMA"
    return float(tr.counts[:, 0].sum()) * rb, "NVL"


def time_phase(tr: MoeTraffic, topo: Topology, phase: str, mode: str, rb: float,
               protocol: str = "Simple", engine: str = "auto") -> PhaseResult:
    """Simulate one phase's flows on ``topo`` (all concurrent, max-min shared)."""
    proto = topo.spec.protocol(protocol)
    fl = flows(tr, topo.gpus, phase, mode, rb)
    keys = list(fl)
    total = float(sum(fl.values())) or 1.0
    src = np.array([k[0] for k in keys], dtype=np.int64)
    dst = np.array([k[1] for k in keys], dtype=np.int64)
    nbytes = np.array([fl[k] for k in keys])
    ph = FlowPhase(dst, src, nbytes / total, np.full(len(keys), phase == "combine"))
    fs = FlowSchedule(f"moe_{phase}", mode, topo.world_size, [ph] if keys else [])
    res = simulate(fs, topo, proto, total, engine)
    # load per link (for the busiest link and the bytes per link kind)
    load = np.zeros(len(topo.capacity))
    by_kind: dict[str, float] = {}
    if keys:
        paths = topo.paths(src, dst)
        for j in range(paths.shape[1]):
            ok = paths[:, j] >= 0
            np.add.at(load, paths[ok, j], nbytes[ok])
    busy = load / (topo.capacity * GB * proto.eff)
    top = int(np.argmax(busy))
    for i in np.nonzero(load)[0]:
        k = topo.link_kind(int(i))
        by_kind[k] = by_kind.get(k, 0.0) + float(load[i])
    counted, how = _counted(tr, phase, mode, rb, topo.nodes)
    nvl = None
    if how == "RDMA":
        nvl = float(tr.counts[:, 0].sum()) * rb / (res.time_us * GB)
    return PhaseResult(phase, res.time_us, counted, how, counted / (res.time_us * GB), nvl,
                       res.bottleneck, topo.link_name(top) if load[top] > 0 else "none",
                       float(busy[top]), topo.spec.launch_us + proto.base_us, len(keys), by_kind)


def predict_moe(system: str | SystemSpec = "dgx-h100", nodes: int = 1, gpus: int | None = None,
                tokens: int = 4096, hidden: int = 7168, topk: int = 8, experts: int = 256,
                fp8: bool = False, mode: str = "normal", seed: int = 0, skew: float = 0.0,
                topk_groups: int | None = None, protocol: str = "Simple",
                engine: str = "auto", expected: bool = False,
                dispatch_row_bytes: int | None = None, combine_row_bytes: int | None = None
                ) -> MoePrediction:
    """Dispatch and combine time of ``tokens`` tokens per rank on ``nodes`` x ``gpus`` ranks.
    ``expected``: the expected traffic of uniform routing instead of a sampled one.
    ``*_row_bytes``: override the row sizes (``tilecomm model``: ``hidden`` x its activation
    bytes)."""
    if mode not in MODES:
        raise ValueError(f"mode must be one of {', '.join(MODES)}, got {mode!r}")
    for name, v in (("tokens", tokens), ("hidden", hidden), ("topk", topk),
                    ("experts", experts)):
        if v <= 0:
            raise ValueError(f"--{name} must be positive, got {v}")
    topo = build(system, nodes, gpus)
    w = topo.world_size
    host_of = [r // topo.gpus for r in range(w)]
    if expected:
        if skew or topk_groups:
            raise ValueError("the expected traffic is that of uniform routing (no skew, no "
                             "topk_groups)")
        tr = expected_traffic(w, topo.gpus, tokens, topk, experts)
        how = "expected (uniform)"
    else:
        idx = synthetic_topk(w, tokens, topk, experts, seed, skew, topk_groups, host_of)
        tr = traffic_of(idx, experts, host_of)
        how = (f"sampled, seed {seed}" + (f", zipf skew {skew}" if skew else ", uniform") +
               (f", top-{topk_groups} groups (nodes)" if topk_groups else ""))
    rb_d = dispatch_row_bytes or (row_bytes(hidden, fp8) +
                                  (LL_HEADER_BYTES if mode == "low_latency" else 0))
    rb_c = combine_row_bytes or row_bytes(hidden, False)
    d = time_phase(tr, topo, "dispatch", mode, rb_d, protocol, engine)
    c = time_phase(tr, topo, "combine", mode, rb_c, protocol, engine)
    return MoePrediction(topo.spec.name, nodes, topo.gpus, w, tokens, hidden, topk, experts,
                         fp8, mode, topo.spec.protocol(protocol).name, how, d, c)


def add_moe_args(p) -> None:
    """The options of ``tilecomm sim moe`` (sim/cli.py registers them)."""
    p.add_argument("--tokens", type=int, default=4096, help="moe: tokens per rank")
    p.add_argument("--hidden", type=int, default=7168, help="moe: hidden size")
    p.add_argument("--topk", type=int, default=8, help="moe: experts per token")
    p.add_argument("--experts", type=int, default=256, help="moe: experts in all")
    p.add_argument("--fp8", action="store_true",
                   help="moe: fp8 dispatch (e4m3 + float32 scale per 128 channels)")
    p.add_argument("--mode", default="normal", choices=list(MODES),
                   help="moe: normal (one crossing per destination host, then NVLink fan-out) "
                        "or low_latency (one message per token and expert)")
    p.add_argument("--seed", type=int, default=0, help="moe: routing seed")
    p.add_argument("--skew", type=float, default=0.0,
                   help="moe: Zipf exponent of expert popularity (0: uniform)")
    p.add_argument("--topk-groups", type=int, default=None,
                   help="moe: node-limited routing, experts of at most this many nodes "
                        "(DeepSeek-V3: 4)")
    p.add_argument("--expected", action="store_true",
                   help="moe: the expected traffic of uniform routing, not a sample")


def run_moe(args) -> int:
    """``tilecomm sim moe``: a table per phase (JSON with ``--json F``)."""
    import json

    p = predict_moe(args.system, args.nodes, args.gpus, args.tokens, args.hidden, args.topk,
                    args.experts, args.fp8, args.mode, args.seed, args.skew, args.topk_groups,
                    args.protocol or "Simple", args.engine, args.expected)
    print(f"moe {p.mode} on {p.system} x{p.nodes} ({p.world} ranks): {p.tokens} tokens/rank, "
          f"hidden {p.hidden}, top-{p.topk} of {p.experts} experts, "
          f"{'fp8' if p.fp8 else 'bf16'} dispatch, bf16 combine; routing {p.routing}; "
          f"protocol {p.protocol}")
    print(f"{'phase':9} {'time us':>9} {'GB/s':>8} {'counted':>8} {'MB counted':>11} "
          f"{'NVL GB/s':>9} {'bottleneck':>11} {'busiest link':>14} {'its us':>8} {'fixed us':>9}")
    for r in (p.dispatch, p.combine):
        nvl = f"{r.nvl_GBps:9.1f}" if r.nvl_GBps is not None else f"{'':9}"
        print(f"{r.phase:9} {r.time_us:9.1f} {r.GBps:8.1f} {r.counted_as:>8} "
              f"{r.counted_bytes / 1e6:11.2f} {nvl} {r.bottleneck:>11} {r.busiest_link:>14} "
              f"{r.busiest_us:8.1f} {r.fixed_us:9.1f}")
    print("GB/s as DeepEP counts it, rank 0: NVL = rows received x row bytes; RDMA = tokens x "
          "destination nodes (own included) x row bytes; LL = (token, expert) selections x "
          "message bytes")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(p.as_dict(), f, indent=1)
    return 0

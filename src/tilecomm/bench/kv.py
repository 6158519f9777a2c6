"""``tilecomm bench kv``: KV-cache transfer throughput against the ways users do it today.

Ranks ``0 .. n/2-1`` prefill and ``n/2 .. n-1`` decode; prefill rank ``i`` sends to decode
rank ``n/2 + i`` (with ``--hosts`` the two halves sit on different simulated hosts). Each round
moves ``requests`` requests of ``request_blocks`` blocks each, pushed layer by layer as prefill
would produce them, all in flight at once. Compared in the same run:

* **naive**: one ``torch.distributed`` send/recv per (layer, block) on Gloo, K and V of the
  block together -- what a serving engine without a transfer engine writes;
* **stream**: bare Gloo carrying a round's bytes in the engine's message sizes, every send
  and receive posted at once: what the link itself carries (its bound, no protocol);
* **memcpy**: one copy of a request's bytes on the sending rank, as one contiguous range:
  inside a host from its cache into the receiver's (the same shared memory the engine writes,
  so the floor for moving those bytes once), and between two private buffers.

The methods run as one bench's case (:mod:`.harness`): interleaved rounds, a round's time
the slowest rank's, the median round reported with its spread. Every method's time is per
request and pair (the engine's and the stream's round divided by the requests in it), every
pair at once, so ``x <method>`` is that method's time over the engine's (above 1: the engine
is faster; memcpy is a floor, at most 1). GB/s = KV bytes all pairs moved / time (DeepEP's and
Mooncake's convention); ``ttfl`` = time from the start of a round until the first request's
layer 0 is ready on the receiver. ``wrong`` counts requests whose blocks differ from the data
the sender wrote (every rank rebuilds it from a seed).
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass

import torch

from ..kv import KVTransfer
from ..kv.schedule import CacheGeometry, request_bytes
from . import harness
from .harness import PRIMARY, Bench
from .timing import Timer, measure

#: the baselines, as rows' keys name them
BASELINES = {"naive": "naive (Gloo send/recv per layer, block)",
             "stream": "bare Gloo stream, engine's message sizes, all posted at once",
             "memcpy_shm": "memcpy of one request, sender's cache -> receiver's",
             "memcpy": "memcpy of one request, private buffers"}


@dataclass
class KVBenchConfig(Bench):
    world_size: int = 2
    hosts: list[int] | None = None      # ranks per simulated host; None: one host
    layers: int = 32
    blocks: int = 1024
    block_size: int = 16
    kv_heads: int = 8
    head_dim: int = 128
    request_blocks: int = 64
    requests: int = 4                   # in flight at once per pair
    rounds: int = 5
    fragmented: bool = False            # random block ids (else one run per request)
    layerwise: bool = True              # one push per layer (as prefill makes them), else one
    dtype: str = "bfloat16"
    timeout: float = 300.0
    seed: int = 1
    max_spread: float = harness.MAX_SPREAD

    kind = "kv"

    @property
    def rank_case(self):
        return rank_kv

    @property
    def id(self) -> str:
        """``kv/<contiguous|fragmented>/<layerwise|whole>/<dtype>/L<layers>xB<blocks>x<block
        size>x<heads>x<head dim>/r<requests>/w<W>``: what one request is, and how it moves."""
        frag = "fragmented" if self.fragmented else "contiguous"
        push = "layerwise" if self.layerwise else "whole"
        hosts = f"/h{'+'.join(map(str, self.hosts))}" if self.hosts else ""
        return (f"kv/{frag}/{push}/{self.dtype}/L{self.layers}xB{self.request_blocks}x"
                f"{self.block_size}x{self.kv_heads}x{self.head_dim}/r{self.requests}/"
                f"w{self.world_size}{hosts}")

    def cases(self) -> list:
        return [self]

    def row(self, case, per_rank: list[dict], ctx: dict) -> dict:
        return summarize(self, per_rank)

    @property
    def geometry(self) -> CacheGeometry:
        return CacheGeometry(self.layers, self.blocks, self.block_size, self.kv_heads,
                             self.head_dim, getattr(torch, self.dtype))

    def validate(self) -> None:
        if self.world_size < 2 or self.world_size % 2:
            raise ValueError(f"bench kv: -n must be even and >= 2 (half prefill, half decode), "
                             f"got {self.world_size}")
        if self.requests * self.request_blocks > self.blocks:
            raise ValueError(f"bench kv: {self.requests} requests x {self.request_blocks} "
                             f"blocks do not fit in {self.blocks} blocks per rank")
        self.geometry      # noqa: B018 - validates the geometry

    @property
    def heap_bytes(self) -> int:
        return self.geometry.nbytes + (64 << 20)


def _ids(cfg: KVBenchConfig, side: int, rnd: int) -> list[list[int]]:
    """Block ids of each request of round ``rnd`` on one side (0 sender, 1 receiver)."""
    n = cfg.requests * cfg.request_blocks
    if not cfg.fragmented:
        pool = list(range(n))
    else:
        g = torch.Generator().manual_seed(cfg.seed * 1000 + 10 * rnd + side)
        pool = torch.randperm(cfg.blocks, generator=g)[:n].tolist()
    b = cfg.request_blocks
    return [pool[i * b:(i + 1) * b] for i in range(cfg.requests)]


def _data(cfg: KVBenchConfig, pair: int) -> torch.Tensor:
    """The bits the sender of ``pair`` writes into the blocks it sends ([L, 2, n, S, H, D])."""
    g = cfg.geometry
    used = cfg.requests * cfg.request_blocks
    gen = torch.Generator().manual_seed(cfg.seed * 7919 + pair)
    shape = (g.layers, 2, used, g.block_size, g.kv_heads, g.head_dim)
    return torch.randint(-(1 << 15), 1 << 15, shape, dtype=torch.int16, generator=gen
                         ).view(g.dtype) if g.itemsize == 2 else \
        torch.randn(shape, generator=gen).to(g.dtype)


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.view({2: torch.int16, 4: torch.int32, 8: torch.int64}[t.element_size()])


class _Pair:
    """One rank's side of the bench: its role, its peer, the cache and the data it sends."""

    def __init__(self, comm, cfg: KVBenchConfig):
        half = comm.world_size // 2
        self.comm, self.cfg = comm, cfg
        self.sender = comm.rank < half
        self.peer = comm.rank + half if self.sender else comm.rank - half
        g = self.g = cfg.geometry
        self.kv = KVTransfer(comm, timeout=cfg.timeout)
        self.cache = self.kv.paged_cache(num_layers=g.layers, num_blocks=g.blocks,
                                         block_size=g.block_size, kv_heads=g.kv_heads,
                                         head_dim=g.head_dim, dtype=g.dtype)
        self.data = _data(cfg, comm.rank % half)
        self.rnd = 0
        self.out = {"transfers": 0, "wrong": 0, "ttfl": [], "post": []}

    def engine(self, t: Timer) -> None:
        """A round of the engine: every request pushed (layer by layer), all in flight;
        the round's time per request, then every received block checked."""
        cfg, g, kv, rnd = self.cfg, self.g, self.kv, self.rnd
        self.rnd += 1
        src_ids, dst_ids = _ids(cfg, 0, rnd), _ids(cfg, 1, rnd)
        if self.sender:
            self.cache[:, :, [b for r in src_ids for b in r]] = self.data
        else:
            self.cache.zero_()
            hs = [kv.expect(f"{rnd}-{i}", src=self.peer, block_ids=dst_ids[i])
                  for i in range(cfg.requests)]
        self.comm.barrier()
        t0 = time.perf_counter()
        if self.sender:
            chunks = [range(k, k + 1) for k in range(g.layers)] if cfg.layerwise else \
                [range(g.layers)]
            pushes = [kv.push(f"{rnd}-{i}", dst=self.peer, block_ids=src_ids[i], layers=lay)
                      for lay in chunks for i in range(cfg.requests)]
            if t.timing:
                self.out["post"].append(time.perf_counter() - t0)
            for ph in pushes:           # across hosts: until the data has left
                ph.wait()
            if rnd == 1:
                self.out["transfers"] = sum(ph.transfers for ph in pushes) // cfg.requests
        else:
            while not hs[0].layer_ready(0):
                pass
            t_first = time.perf_counter() - t0
            for h in hs:
                h.wait()
            if t.timing:
                self.out["ttfl"].append(t_first)
        t.add("request", (time.perf_counter() - t0) / cfg.requests)
        if not self.sender:
            for i in range(cfg.requests):
                blk = self.cache[:, :, dst_ids[i]]
                want = self.data[:, :, i * cfg.request_blocks:(i + 1) * cfg.request_blocks]
                self.out["wrong"] += int(not torch.equal(_bits(blk), _bits(want)))
        self.comm.barrier()

    def naive(self, t: Timer) -> None:
        """One request by one Gloo send/recv per (layer, block)."""
        import torch.distributed as dist
        g = self.g
        src_ids, dst_ids = _ids(self.cfg, 0, 0)[0], _ids(self.cfg, 1, 0)[0]
        tmp = torch.empty((2, g.block_size, g.kv_heads, g.head_dim), dtype=g.dtype)
        dist.barrier()
        t0 = time.perf_counter()
        for layer in range(g.layers):
            for s, d in zip(src_ids, dst_ids):
                if self.sender:
                    dist.send(self.cache[layer, :, s].contiguous(), self.peer)
                else:
                    dist.recv(tmp, self.peer)
                    self.cache[layer, :, d] = tmp
        t.add("request", time.perf_counter() - t0)

    def stream(self, t: Timer) -> None:
        """The link's own rate: a round's bytes, cut as the engine cuts them (one message per
        layer, K/V and run), streamed by bare Gloo with every receive posted at once."""
        import torch.distributed as dist
        cfg, g = self.cfg, self.g
        flat = self.cache.view(-1).view(torch.uint8)
        piece = g.block_bytes * cfg.request_blocks if not cfg.fragmented else g.block_bytes
        count = cfg.requests * request_bytes(g, cfg.request_blocks) // piece
        dist.barrier()
        t0 = time.perf_counter()
        works = [dist.isend(flat[k * piece:(k + 1) * piece], self.peer, tag=k) if self.sender
                 else dist.irecv(flat[k * piece:(k + 1) * piece], self.peer, tag=k)
                 for k in range(count)]
        for w in works:
            w.wait()
        t.add("request", (time.perf_counter() - t0) / cfg.requests)

    def copies(self) -> dict:
        """The memcpy floors' buffers on a sender: one request's bytes between private
        buffers, and (inside a host) from its cache into the receiver's, the same shared
        memory the engine moves between."""
        if not self.sender:
            return {}
        nbytes = request_bytes(self.g, self.cfg.request_blocks)
        pairs = {"memcpy": (torch.empty(nbytes, dtype=torch.uint8).random_().numpy(),
                            torch.empty(nbytes, dtype=torch.uint8).numpy())}
        layout = self.comm.layout
        if layout.host_of(self.peer) == layout.host_of(self.comm.rank):
            flat = self.cache.view(-1).view(torch.uint8)
            pairs["memcpy_shm"] = (flat[:nbytes].numpy(), self.comm.peer(
                self.cache, self.peer).view(-1).view(torch.uint8)[:nbytes].numpy())
        return pairs

    def memcpy(self, pair):
        """A round of a memcpy floor: every sender copies at once; receivers wait."""
        def method(t: Timer):
            self.comm.barrier()
            if pair is not None:
                a, b = pair
                t0 = time.perf_counter()
                b[...] = a
                t.add("request", time.perf_counter() - t0)
            self.comm.barrier()       # no copy lands in a receiver's cache in the next round
        return method


def rank_kv(comm, cfg: KVBenchConfig, case=None) -> dict:
    """Run on every rank (tilecomm.launch / HostsGroup): the engine's rounds, the naive
    baseline's, the link's and the memcpy floors', interleaved. Returns this rank's timings."""
    p = _Pair(comm, cfg)
    copies = p.copies()
    methods = {PRIMARY: p.engine, "naive": p.naive, "stream": p.stream}
    # every rank runs the same methods (the barriers meet); shm only inside a host
    shm = comm.layout.host_of(p.peer) == comm.layout.host_of(comm.rank)
    for name in ("memcpy_shm", "memcpy") if shm else ("memcpy",):
        methods[name] = p.memcpy(copies.get(name))
    times = measure(comm.barrier, methods, cfg.rounds)
    comm.barrier()
    p.kv.close()
    return dict(p.out, times=times, sender=p.sender)


def summarize(cfg: KVBenchConfig, per_rank: list[dict]) -> dict:
    """The row: the shared timing fields (per request and pair), rates and counts."""
    pairs = cfg.world_size // 2
    req_bytes = request_bytes(cfg.geometry, cfg.request_blocks)
    row = harness.case_row(cfg.kind, cfg.id, per_rank, list(BASELINES), cfg.max_spread)
    ttfl = harness.slowest_rounds([r["ttfl"] for r in per_rank])
    post = harness.slowest_rounds([r["post"] for r in per_rank])
    row.update({
        "world_size": cfg.world_size, "hosts": cfg.hosts, "layers": cfg.layers,
        "request_blocks": cfg.request_blocks, "block_size": cfg.block_size,
        "kv_heads": cfg.kv_heads, "head_dim": cfg.head_dim, "dtype": cfg.dtype,
        "requests": cfg.requests, "fragmented": cfg.fragmented, "layerwise": cfg.layerwise,
        "rounds": cfg.rounds, "request_bytes": req_bytes, "requests_per_round": pairs * cfg.requests,
        "transfers_per_request": max(r["transfers"] for r in per_rank),
        "naive_transfers_per_request": cfg.layers * cfg.request_blocks,
        "ttfl_us": statistics.median(ttfl) * 1e6 if ttfl else None,
        # time the senders spent in push calls (inside a host the copies themselves)
        "push_calls_us": statistics.median(post) * 1e6 if post else None,
        "wrong": sum(r["wrong"] for r in per_rank)})
    # GB/s: the bytes every pair moves at once, per request, over the time per request
    for name in [PRIMARY, *BASELINES]:
        key = "time_us" if name == PRIMARY else f"{name}_time_us"
        if row.get(key):
            row["gbs" if name == PRIMARY else f"{name}_gbs"] = pairs * req_bytes / row[key] / 1e3
    return row


def run(cfg: KVBenchConfig) -> dict:
    """Start the ranks (local processes, or simulated hosts with ``cfg.hosts``), run
    :func:`rank_kv` on each, and return the row."""
    return harness.run(cfg)[0]


def table(rows: list[dict]):
    """The rich table ``tilecomm bench kv`` prints: times per request and pair, ratios."""
    from ..units import format_size
    from .report import num, table as render

    c = rows[0]
    where = f"{len(c['hosts'])} simulated hosts" if c["hosts"] else "one host"
    title = (f"tilecomm kv: {c['world_size']} ranks on {where}, {c['layers']} layers x "
             f"{c['request_blocks']} blocks of {c['block_size']} tokens x {c['kv_heads']} heads "
             f"x {c['head_dim']} ({c['dtype']}), {format_size(c['request_bytes'])} per request, "
             f"{c['requests']} in flight per pair, "
             f"{'fragmented' if c['fragmented'] else 'contiguous'} blocks, "
             f"{'per-layer' if c['layerwise'] else 'whole-request'} pushes; times per "
             f"request and pair, all pairs at once")
    mid = [("GB/s", lambda r: num(r.get("gbs"))),
           ("transfers/request", lambda r: f"{r['transfers_per_request']} (naive "
                                           f"{r['naive_transfers_per_request']})"),
           ("first layer (ms)", lambda r: num(r["ttfl_us"] / 1e3 if r["ttfl_us"] else None)),
           ("stream GB/s", lambda r: num(r.get("stream_gbs"))),
           ("#wrong", lambda r: str(r["wrong"]))]
    return render(rows, title, mid=mid, unit="ms",
                  notes=[f"{k}: {v}" for k, v in BASELINES.items() if f"x_{k}" in c])

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

Times are medians over rounds of the slowest rank; GB/s = KV bytes moved / time (DeepEP's and
Mooncake's convention); ``ttfl`` = time from the start of a round until the first request's
layer 0 is ready on the receiver. ``wrong`` counts requests whose blocks differ from the data
the sender wrote (every rank rebuilds it from a seed).
"""

from __future__ import annotations

import statistics
import time
from dataclasses import asdict, dataclass, field

import torch

from ..kv import KVTransfer
from ..kv.schedule import CacheGeometry, request_bytes


@dataclass
class KVBenchConfig:
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
    naive_rounds: int = 3
    fragmented: bool = False            # random block ids (else one run per request)
    layerwise: bool = True              # one push per layer (as prefill makes them), else one
    dtype: str = "bfloat16"
    timeout: float = 300.0
    seed: int = 1
    ids: dict = field(default_factory=dict)

    @property
    def geometry(self) -> CacheGeometry:
        return CacheGeometry(self.layers, self.blocks, self.block_size, self.kv_heads,
                             self.head_dim, getattr(torch, self.dtype))

    def check(self) -> None:
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


def rank_kv(comm, cfg: KVBenchConfig) -> dict:
    """Run on every rank (tilecomm.launch / HostsGroup): the engine's rounds, then the naive
    baseline, then the memcpy floor. Returns this rank's timings."""
    import torch.distributed as dist

    half = comm.world_size // 2
    sender = comm.rank < half
    pair = comm.rank % half
    peer = comm.rank + half if sender else comm.rank - half
    g = cfg.geometry
    kv = KVTransfer(comm, timeout=cfg.timeout)
    cache = kv.paged_cache(num_layers=g.layers, num_blocks=g.blocks, block_size=g.block_size,
                           kv_heads=g.kv_heads, head_dim=g.head_dim, dtype=g.dtype)
    data = _data(cfg, pair)
    out = {"rank": comm.rank, "sender": sender, "rounds": [], "ttfl": [], "transfers": 0,
           "wrong": 0, "naive": [], "memcpy": [], "memcpy_shm": [], "post": [], "stream": []}
    for rnd in range(cfg.rounds + 1):           # round 0 warms up (first touch, connections)
        src_ids, dst_ids = _ids(cfg, 0, rnd), _ids(cfg, 1, rnd)
        if sender:
            flat = [b for r in src_ids for b in r]
            cache[:, :, flat] = data
        else:
            cache.zero_()
            hs = [kv.expect(f"{rnd}-{i}", src=peer, block_ids=dst_ids[i])
                  for i in range(cfg.requests)]
        comm.barrier()
        t0 = time.perf_counter()
        if sender:
            pushes = []
            chunks = [range(k, k + 1) for k in range(g.layers)] if cfg.layerwise else \
                [range(g.layers)]
            for layers in chunks:
                for i in range(cfg.requests):
                    pushes.append(kv.push(f"{rnd}-{i}", dst=peer, block_ids=src_ids[i],
                                          layers=layers))
            if rnd:
                out["post"].append(time.perf_counter() - t0)
            for ph in pushes:           # across hosts: until the data has left
                ph.wait()
            if rnd == 1:
                out["transfers"] = sum(ph.transfers for ph in pushes) // cfg.requests
        else:
            while not hs[0].layer_ready(0):
                pass
            t_first = time.perf_counter() - t0
            for h in hs:
                h.wait()
        dt = time.perf_counter() - t0
        if rnd:
            out["rounds"].append(dt)
            if not sender:
                out["ttfl"].append(t_first)
        if not sender:
            for i in range(cfg.requests):
                blk = cache[:, :, dst_ids[i]]
                want = data[:, :, i * cfg.request_blocks:(i + 1) * cfg.request_blocks]
                out["wrong"] += int(not torch.equal(_bits(blk), _bits(want)))
        comm.barrier()
    # naive: one send/recv per (layer, block) on Gloo, one request per round
    src_ids, dst_ids = _ids(cfg, 0, 0)[0], _ids(cfg, 1, 0)[0]
    tmp = torch.empty((2, g.block_size, g.kv_heads, g.head_dim), dtype=g.dtype)
    for rnd in range(cfg.naive_rounds + 1):
        dist.barrier()
        t0 = time.perf_counter()
        for layer in range(g.layers):
            for s, d in zip(src_ids, dst_ids):
                if sender:
                    dist.send(cache[layer, :, s].contiguous(), peer)
                else:
                    dist.recv(tmp, peer)
                    cache[layer, :, d] = tmp
        if rnd:
            out["naive"].append(time.perf_counter() - t0)
    # the link's own rate: the same bytes as a round, cut as the engine cuts them (one
    # message per layer, K/V and run), streamed by bare Gloo with every receive posted at once
    flat = cache.view(-1).view(torch.uint8)
    piece = g.block_bytes * cfg.request_blocks if not cfg.fragmented else g.block_bytes
    count = cfg.requests * request_bytes(g, cfg.request_blocks) // piece
    for rnd in range(cfg.naive_rounds + 1):
        dist.barrier()
        t0 = time.perf_counter()
        works = [dist.isend(flat[k * piece:(k + 1) * piece], peer, tag=k) if sender else
                 dist.irecv(flat[k * piece:(k + 1) * piece], peer, tag=k) for k in range(count)]
        for w in works:
            w.wait()
        if rnd:
            out["stream"].append(time.perf_counter() - t0)
    # memcpy of one request's bytes on the sender: from its cache into the receiver's, the
    # same memory the engine moves between (inside a host), and between private buffers
    comm.barrier()
    if sender:
        nbytes = request_bytes(g, cfg.request_blocks)
        pairs = [("memcpy", torch.empty(nbytes, dtype=torch.uint8).random_().numpy(),
                  torch.empty(nbytes, dtype=torch.uint8).numpy())]
        if comm.layout.host_of(peer) == comm.layout.host_of(comm.rank):
            flat = cache.view(-1).view(torch.uint8)
            pairs.append(("memcpy_shm", flat[:nbytes].numpy(),
                          comm.peer(cache, peer).view(-1).view(torch.uint8)[:nbytes].numpy()))
        for key, a, b in pairs:
            for rnd in range(cfg.rounds + 1):
                t0 = time.perf_counter()
                b[...] = a
                if rnd:
                    out[key].append(time.perf_counter() - t0)
    comm.barrier()
    kv.close()
    del cache
    return out


def summarize(cfg: KVBenchConfig, per_rank: list[dict]) -> dict:
    """One row: medians of the slowest rank per round, rates and ratios."""
    nreq = cfg.requests * (cfg.world_size // 2)
    req_bytes = request_bytes(cfg.geometry, cfg.request_blocks)

    def slowest(key):
        rows = [r[key] for r in per_rank if r[key]]
        return [max(v) for v in zip(*rows)] if rows else []

    eng = statistics.median(slowest("rounds"))
    naive = statistics.median(slowest("naive"))
    def fastest_copy(key):
        mem = [r[key] for r in per_rank if r["sender"] and r[key]]
        return statistics.median(min(v) for v in zip(*mem)) if mem else None

    memcpy, memcpy_shm = fastest_copy("memcpy"), fastest_copy("memcpy_shm")
    eng_req = eng / cfg.requests               # one request's share of a round, per pair
    row = {
        "request_bytes": req_bytes, "requests_per_round": nreq,
        "transfers_per_request": max(r["transfers"] for r in per_rank),
        "engine_s": eng, "engine_GBps": nreq * req_bytes / eng / 1e9,
        "ttfl_s": statistics.median(slowest("ttfl")) if slowest("ttfl") else None,
        # time the senders spent in push calls (inside a host the copies themselves)
        "push_calls_s": statistics.median(slowest("post")),
        "naive_s_per_request": naive,
        "naive_GBps": (cfg.world_size // 2) * req_bytes / naive / 1e9,
        "naive_transfers_per_request": cfg.layers * cfg.request_blocks,
        # bare Gloo streaming a round's bytes in the engine's message sizes, all posted at once
        "stream_GBps": nreq * req_bytes / statistics.median(slowest("stream")) / 1e9,
        "speedup_vs_naive": naive / eng_req,
        "memcpy_s": memcpy, "memcpy_GBps": req_bytes / memcpy / 1e9,
        "engine_vs_memcpy": eng_req / memcpy,
        # inside a host: one copy of the request's bytes from the sender's cache into the
        # receiver's (the same shared memory the engine moves between)
        "memcpy_shm_s": memcpy_shm,
        "memcpy_shm_GBps": req_bytes / memcpy_shm / 1e9 if memcpy_shm else None,
        "engine_vs_memcpy_shm": eng_req / memcpy_shm if memcpy_shm else None,
        "wrong": sum(r["wrong"] for r in per_rank),
        "config": {k: v for k, v in asdict(cfg).items() if k != "ids"},
    }
    return row


def run(cfg: KVBenchConfig) -> dict:
    """Start the ranks (local processes, or simulated hosts with ``cfg.hosts``), run
    :func:`rank_kv` on each, and summarize."""
    from ..launch import RankGroup
    from .runner import free_port, rank_init_gloo

    cfg.check()
    if cfg.hosts:
        from .hosts_group import HostsGroup
        group_cm = HostsGroup(cfg.hosts, timeout=cfg.timeout, heap_bytes=cfg.heap_bytes)
    else:
        group_cm = RankGroup(cfg.world_size, timeout=cfg.timeout, heap_bytes=cfg.heap_bytes)
    with group_cm as group:
        group.run(rank_init_gloo, free_port())
        per_rank = group.run(rank_kv, cfg)
    return summarize(cfg, per_rank)


def table(row: dict):
    """The rich table ``tilecomm bench kv`` prints: one line per method, ratios last."""
    from rich.table import Table

    from .report import format_size

    c = row["config"]
    where = f"{len(c['hosts'])} simulated hosts" if c["hosts"] else "one host"
    title = (f"tilecomm kv: {c['world_size']} ranks on {where}, {c['layers']} layers x "
             f"{c['request_blocks']} blocks of {c['block_size']} tokens x {c['kv_heads']} heads "
             f"x {c['head_dim']} ({c['dtype']}), {format_size(row['request_bytes'])} per request, "
             f"{c['requests']} in flight per pair, "
             f"{'fragmented' if c['fragmented'] else 'contiguous'} blocks, "
             f"{'per-layer' if c['layerwise'] else 'whole-request'} pushes")
    t = Table(title=title, header_style="bold")
    for col in ("method", "time per request (ms)", "GB/s", "transfers/request",
                "first layer (ms)", "x naive", "x memcpy", "#wrong"):
        t.add_column(col, justify="left" if col == "method" else "right")
    per_req = row["engine_s"] / c["requests"]
    mem = row["memcpy_s"]
    shm = row["memcpy_shm_s"]
    ratio = f"{row['engine_vs_memcpy_shm']:.2f} (shm) / " if shm else ""
    t.add_row("tilecomm.kv", f"{1e3 * per_req:.2f}", f"{row['engine_GBps']:.2f}",
              str(row["transfers_per_request"]),
              f"{1e3 * row['ttfl_s']:.2f}" if row["ttfl_s"] is not None else "",
              f"{row['speedup_vs_naive']:.1f}",
              f"{ratio}{row['engine_vs_memcpy']:.2f}", str(row["wrong"]))
    t.add_row("bare Gloo stream, engine's message sizes, all posted at once", "",
              f"{row['stream_GBps']:.2f}", "", "", "", "", "")
    t.add_row("naive (Gloo send/recv per layer, block)",
              f"{1e3 * row['naive_s_per_request']:.2f}", f"{row['naive_GBps']:.2f}",
              str(row["naive_transfers_per_request"]), "", "1.0", "", "")
    if shm:
        t.add_row("memcpy of one request, sender's cache -> receiver's", f"{1e3 * shm:.2f}",
                  f"{row['memcpy_shm_GBps']:.2f}", "1", "", "", "1.00 (shm)", "")
    t.add_row("memcpy of one request, private buffers", f"{1e3 * mem:.2f}",
              f"{row['memcpy_GBps']:.2f}", "1", "", "", "1.00", "")
    return t

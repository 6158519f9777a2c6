"""``tilecomm bench moe``: MoE dispatch and combine against the all_to_all layer users write.

Every rank has ``tokens`` tokens of ``hidden`` channels (bfloat16), routed to ``topk`` of
``experts`` experts uniformly at random (:func:`tilecomm.moe.random_topk`). The experts are the
identity (the caller's output per received row is the row itself), so the times are the
communication alone and the result is checkable: every token comes back multiplied by the
number of ranks it went to. Compared in the same run, on the same routing:

* **tilecomm.moe**: ``ep.dispatch`` then ``ep.combine`` (normal or low-latency mode, fp8);
* **gloo all_to_all_single**: the layer without such a library: permute the rows by
  destination rank (each token once per rank, as tilecomm sends them), exchange the counts,
  then ``torch.distributed.all_to_all_single`` of the rows, their topk ids and weights on
  Gloo; combine: ``all_to_all_single`` back and an ``index_add_`` per token in float32;
* **tilecomm all_to_all_v**: the same permute, with tilecomm's uneven all-to-all
  (``comm.all_to_all_v``) in place of Gloo's.

Times are medians over rounds of the slowest rank, each phase timed between barriers. GB/s
follows DeepEP's convention: bytes of token rows a rank receives in dispatch (fp8 rows and
their scales under ``--fp8``), the same rows in the layer's dtype sent back in combine, over
the phase's time, averaged over ranks; a row per (source, token) in normal mode, per
(token, expert) slot in low-latency mode (as DeepEP's low-latency test counts). The memory bound: each of those bytes must be written
once at the copy rate (dispatch) and added once at the add rate (combine), measured with all
ranks running (:func:`.roofline.measure_rates`); one host only.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import asdict, dataclass

import torch

from ..moe import ExpertParallel, fp8 as fp8mod, routing

METHODS = ("tilecomm.moe", "gloo all_to_all_single", "tilecomm all_to_all_v")


@dataclass
class MoEBenchConfig:
    world_size: int = 2
    hosts: list[int] | None = None          # ranks per simulated host; None: one host
    tokens: int = 4096
    hidden: int = 7168
    topk: int = 8
    experts: int = 64
    mode: str = "normal"                    # or low_latency
    fp8: bool = False
    rounds: int = 5
    dtype: str = "bfloat16"
    baselines: bool = True
    bound: bool = True
    timeout: float = 300.0
    seed: int = 1

    def check(self) -> None:
        if self.mode not in ("normal", "low_latency"):
            raise ValueError(f"bench moe: --mode must be normal or low_latency, not {self.mode}")
        routing.experts_per_rank(self.experts, self.world_size)
        if not 1 <= self.topk <= self.experts:
            raise ValueError(f"bench moe: --topk {self.topk} must be in [1, --experts]")
        if self.fp8:
            fp8mod.scale_blocks(self.hidden)

    @property
    def heap_bytes(self) -> int:
        # two workspace halves, each up to every row a rank can receive (W * T) with its topk
        # ids and weights, plus slack for the baselines' staging
        row = self.hidden * torch.empty((), dtype=getattr(torch, self.dtype)).element_size()
        return 2 * self.world_size * self.tokens * (row + 12 * self.topk) + (256 << 20)


def _inputs(cfg: MoEBenchConfig, rank: int):
    g = torch.Generator().manual_seed(cfg.seed * 1000 + rank)
    dt = getattr(torch, cfg.dtype)
    x = torch.randn((cfg.tokens, cfg.hidden), generator=g).to(dt)
    idx = routing.random_topk(cfg.tokens, cfg.topk, cfg.experts, generator=g)
    w = torch.rand((cfg.tokens, cfg.topk), generator=g)
    return x, idx, w


def _expected(cfg: MoEBenchConfig, x, idx, w, el, world) -> torch.Tensor:
    """What combine gives with identity experts: normal mode ``n_dest(t) * x[t]``
    (rows come back unweighted); low-latency mode ``sum_k w[t,k] * x[t]`` (combine weights)."""
    xs = fp8mod.dequantize(*fp8mod.quantize(x), x.dtype) if cfg.fp8 else x
    if cfg.mode == "low_latency":
        f = torch.where(idx >= 0, w, 0).sum(1, keepdim=True)
    else:
        f = routing.dest_mask(idx, el, world).sum(1, keepdim=True).to(torch.float32)
    # + 0.0: combine accumulates from a +0 float32 accumulator, so a row that is -0 (an fp8
    # block rounds tiny negatives to -0) comes back as +0
    return (xs.to(torch.float32) * f + 0.0).to(x.dtype)


def _wrong(cfg, got, want) -> int:
    """Tokens off: normal mode exactly (n copies of a bf16 value sum exactly in float32);
    low-latency sums weighted products in another order, so within bf16 rounding."""
    if cfg.mode == "low_latency":
        bad = ~torch.isclose(got.float(), want.float(), rtol=1e-2, atol=1e-2)
    else:
        bad = got.view(torch.int16) != want.view(torch.int16) if got.element_size() == 2 \
            else got != want
    return int(bad.any(1).sum())


def _timed(comm, fn):
    comm.barrier()
    t0 = time.perf_counter()
    res = fn()
    return res, time.perf_counter() - t0


def _tilecomm_round(comm, cfg, ep, x, idx, w):
    m = cfg.tokens
    if cfg.mode == "low_latency":
        d, td = _timed(comm, lambda: ep.dispatch(x, idx, w, mode="low_latency",
                                                 max_tokens_per_rank=m, fp8=cfg.fp8))
    else:
        d, td = _timed(comm, lambda: ep.dispatch(x, idx, w, fp8=cfg.fp8))
    y = d.dequantized(x.dtype) if cfg.fp8 else d.x          # identity experts (untimed)
    out, tc = _timed(comm, lambda: ep.combine(y, d))
    rows = int(d.count.sum()) if cfg.mode == "low_latency" else d.x.shape[0]
    return out, td, tc, rows


def permuted_dispatch(x, idx, w, el: int, world: int, fp8: bool, a2a, group=None):
    """The all_to_all layer's dispatch: permute the rows by destination rank (each token once
    per rank it goes to), exchange the counts (``all_to_all_single`` on ``group``, on ``x``'s
    device), move rows, topk ids and weights with ``a2a(tensor, send_counts, recv_counts)``.
    Returns ``(send_tok, send, recv, got)``: ``got`` what arrived per part
    (:func:`received_rows` makes the rows of it)."""
    import torch.distributed as dist
    mask = routing.dest_mask(idx, el, world)
    send_tok = torch.cat([mask[:, r].nonzero(as_tuple=True)[0] for r in range(world)])
    counts = mask.sum(0).to(torch.int64)
    recv_t = torch.empty_like(counts)
    dist.all_to_all_single(recv_t, counts, group=group)       # the count exchange
    send, recv = counts.tolist(), recv_t.tolist()
    if fp8:
        q, s = fp8mod.quantize(x.index_select(0, send_tok))
        parts = [q.view(torch.uint8), s]
    else:
        parts = [x.index_select(0, send_tok)]
    parts += [idx.index_select(0, send_tok), w.index_select(0, send_tok)]
    return send_tok, send, recv, [a2a(p, send, recv) for p in parts]


def received_rows(got, fp8: bool, dtype):
    """The rows :func:`permuted_dispatch` received, in the layer's dtype (what the experts
    read; untimed, as tilecomm's ``dequantized``)."""
    return fp8mod.dequantize(got[0].view(torch.float8_e4m3fn), got[1], dtype) if fp8 \
        else got[0]


def permuted_combine(y, x, send_tok, send, recv, a2a):
    """The all_to_all layer's combine: the rows back, then one ``index_add_`` per token in
    float32 on ``x``'s device."""
    back = a2a(y, recv, send)
    acc = torch.zeros((x.shape[0], x.shape[1]), dtype=torch.float32, device=x.device)
    acc.index_add_(0, send_tok, back.to(torch.float32))
    return acc.to(x.dtype)


def _permuted_round(comm, cfg, x, idx, w, el, a2a):
    """One timed round of the all_to_all layer: ``a2a(tensor, send_counts, recv_counts)``
    moves rows."""
    world = comm.world_size
    (send_tok, send, recv, got), td = _timed(
        comm, lambda: permuted_dispatch(x, idx, w, el, world, cfg.fp8, a2a))
    y = received_rows(got, cfg.fp8, x.dtype)
    out, tc = _timed(comm, lambda: permuted_combine(y, x, send_tok, send, recv, a2a))
    return out, td, tc


def a2a_single(t, send, recv, group=None):
    """``all_to_all_single`` of rows (``send``/``recv`` counts per rank) on ``group``; 16-bit
    rows travel as bytes (Gloo has no 16-bit types)."""
    import torch.distributed as dist
    t = t.contiguous()
    out = torch.empty((sum(recv),) + tuple(t.shape[1:]), dtype=t.dtype, device=t.device)
    if t.dtype in (torch.bfloat16, torch.float16) and t.device.type == "cpu":
        dist.all_to_all_single(out.view(torch.uint8), t.view(torch.uint8), recv, send,
                               group=group)
    else:
        dist.all_to_all_single(out, t, recv, send, group=group)
    return out


def rank_moe(comm, cfg: MoEBenchConfig) -> dict:
    """Run on every rank: tilecomm's rounds, then the baselines', then the memory rates."""
    world = comm.world_size
    el = cfg.experts // world
    x, idx, w = _inputs(cfg, comm.rank)
    want = _expected(cfg, x, idx, w, el, world)
    ep = ExpertParallel(comm, num_experts=cfg.experts, hidden=cfg.hidden,
                        dtype=getattr(torch, cfg.dtype))
    res = {m: {"dispatch": [], "combine": [], "wrong": 0} for m in METHODS}
    res["rows"] = 0
    with torch.no_grad():
        for rnd in range(cfg.rounds + 1):              # round 0 warms up
            out, td, tc, rows = _tilecomm_round(comm, cfg, ep, x, idx, w)
            _record(res["tilecomm.moe"], rnd, td, tc, _wrong(cfg, out, want))
            res["rows"] = rows
        if cfg.baselines and cfg.mode == "normal":
            a2a_v = lambda t, send, recv: comm.all_to_all_v(t.contiguous(), send, recv)  # noqa
            for name, a2a in (("gloo all_to_all_single", a2a_single),
                              ("tilecomm all_to_all_v", a2a_v)):
                for rnd in range(cfg.rounds + 1):
                    out, td, tc = _permuted_round(comm, cfg, x, idx, w, el, a2a)
                    _record(res[name], rnd, td, tc, _wrong(cfg, out, want))
    if cfg.bound and not cfg.hosts:
        from .roofline import measure_rates
        res["rates"] = measure_rates(comm)
    return res


def _record(slot, rnd, td, tc, wrong) -> None:
    if rnd:
        slot["dispatch"].append(td)
        slot["combine"].append(tc)
    slot["wrong"] += wrong


def summarize(cfg: MoEBenchConfig, per_rank: list[dict]) -> dict:
    """One row per method: medians of the slowest rank, GB/s, ratios to the Gloo layer."""
    itemsize = torch.empty((), dtype=getattr(torch, cfg.dtype)).element_size()
    rows = statistics.mean(r["rows"] for r in per_rank)
    disp_row = cfg.hidden + 4 * (cfg.hidden // 128) if cfg.fp8 else cfg.hidden * itemsize
    disp_bytes, comb_bytes = rows * disp_row, rows * cfg.hidden * itemsize
    out = {"config": asdict(cfg), "rows_per_rank": rows, "dispatch_bytes": disp_bytes,
           "combine_bytes": comb_bytes, "methods": {}}
    for m in METHODS:
        if not per_rank[0][m]["dispatch"]:
            continue
        d = statistics.median(max(v) for v in zip(*(r[m]["dispatch"] for r in per_rank)))
        c = statistics.median(max(v) for v in zip(*(r[m]["combine"] for r in per_rank)))
        out["methods"][m] = {"dispatch_s": d, "combine_s": c, "total_s": d + c,
                             "dispatch_GBps": disp_bytes / d / 1e9,
                             "combine_GBps": comb_bytes / c / 1e9,
                             "wrong": sum(r[m]["wrong"] for r in per_rank)}
    base = out["methods"].get("gloo all_to_all_single")
    for m, v in out["methods"].items():
        v["x_gloo"] = base["total_s"] / v["total_s"] if base else None
    rates = [r["rates"] for r in per_rank if r.get("rates")]
    if rates:
        copy = min(r["copy"] for r in rates)
        add = min(r["add"] for r in rates)
        out["bound_s"] = {"dispatch": disp_bytes / copy, "combine": comb_bytes / add}
        t = out["methods"]["tilecomm.moe"]
        out["fraction_of_bound"] = {k: out["bound_s"][k] / t[k + "_s"]
                                    for k in ("dispatch", "combine")}
    out["wrong"] = sum(v["wrong"] for v in out["methods"].values())
    return out


def run(cfg: MoEBenchConfig) -> dict:
    """Start the ranks (local processes, or simulated hosts with ``cfg.hosts``), run
    :func:`rank_moe` on each, and summarize."""
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
        per_rank = group.run(rank_moe, cfg)
    return summarize(cfg, per_rank)


def table(row: dict):
    """The rich table ``tilecomm bench moe`` prints."""
    from rich.table import Table

    c = row["config"]
    where = f"{len(c['hosts'])} simulated hosts" if c["hosts"] else "one host"
    title = (f"tilecomm moe: {c['world_size']} ranks on {where}, {c['tokens']} tokens x "
             f"{c['hidden']} ({c['dtype']}{', fp8 dispatch' if c['fp8'] else ''}), top-"
             f"{c['topk']} of {c['experts']} experts, {c['mode']} mode, "
             f"{row['rows_per_rank']:.0f} rows received per rank")
    t = Table(title=title, header_style="bold")
    for col in ("method", "dispatch (ms)", "combine (ms)", "dispatch GB/s", "combine GB/s",
                "x gloo (total)", "#wrong"):
        t.add_column(col, justify="left" if col == "method" else "right")
    for m, v in row["methods"].items():
        t.add_row(m, f"{1e3 * v['dispatch_s']:.2f}", f"{1e3 * v['combine_s']:.2f}",
                  f"{v['dispatch_GBps']:.2f}", f"{v['combine_GBps']:.2f}",
                  f"{v['x_gloo']:.2f}" if v["x_gloo"] else "", str(v["wrong"]))
    if row.get("bound_s"):
        b, f = row["bound_s"], row["fraction_of_bound"]
        t.add_row("memory bound (write each row byte once)", f"{1e3 * b['dispatch']:.2f}",
                  f"{1e3 * b['combine']:.2f}", f"tilecomm at {100 * f['dispatch']:.0f}%",
                  f"tilecomm at {100 * f['combine']:.0f}%", "", "")
    return t

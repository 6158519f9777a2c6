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

The methods run as one bench's cases (:mod:`.harness`): interleaved rounds, each phase timed
between barriers, a round's time the sum over phases of the slowest rank's, the median round
reported with its spread; ``x gloo`` and ``x a2av`` are the layer's time over tilecomm's
(above 1: tilecomm is faster). GB/s follows DeepEP's convention: bytes of token rows a rank
receives in dispatch (fp8 rows and their scales under ``--fp8``), the same rows in the layer's
dtype sent back in combine, over the phase's time, averaged over ranks; a row per (source,
token) in normal mode, per (token, expert) slot in low-latency mode (as DeepEP's low-latency
test counts). The memory bound: each of those bytes must be written once at the copy rate
(dispatch) and added once at the add rate (combine), at the rates of the level the working set
is held to (:mod:`.roofline`: cache or DRAM); one host only.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass

import torch

from ..moe import ExpertParallel, fp8 as fp8mod, routing
from . import harness
from .harness import PRIMARY, Bench
from .timing import Timer, measure

#: the methods, as rows' keys name them: tilecomm.moe, and the all_to_all layer on Gloo's
#: all_to_all_single and on tilecomm's all_to_all_v
METHODS = {PRIMARY: "tilecomm.moe", "gloo": "permute + Gloo all_to_all_single",
           "a2av": "permute + tilecomm all_to_all_v"}


@dataclass
class MoEBenchConfig(Bench):
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
    max_spread: float = harness.MAX_SPREAD

    kind = "moe"

    @property
    def rank_case(self):
        return rank_moe

    @property
    def id(self) -> str:
        """The case id: ``moe/<mode>/<dtype>[+fp8]/t<tokens>/h<hidden>/top<k>/e<experts>/w<W>``."""
        dt = self.dtype + ("+fp8" if self.fp8 else "")
        hosts = f"/h{'+'.join(map(str, self.hosts))}" if self.hosts else ""
        return (f"moe/{self.mode}/{dt}/t{self.tokens}/h{self.hidden}/top{self.topk}/"
                f"e{self.experts}/w{self.world_size}{hosts}")

    def cases(self) -> list:
        return [self]

    def prepare(self, group) -> dict:
        super().prepare(group)
        if not self.bound or self.hosts:
            return {"rates": None}
        from .roofline import measure_rates, merge_rates
        return {"rates": merge_rates(group.run(measure_rates))}

    def finish(self, group, ctx: dict) -> dict:
        """The rates again after the case; the faster of the two counts (``roofline``)."""
        if ctx["rates"] is None:
            return ctx
        from .roofline import measure_rates, merge_rates
        return {"rates": merge_rates([ctx["rates"], *group.run(measure_rates)])}

    def row(self, case, per_rank: list[dict], ctx: dict) -> dict:
        return summarize(self, per_rank, ctx.get("rates"))

    def validate(self) -> None:
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


def _tilecomm_method(cfg, ep, x, idx, w, want, res):
    """tilecomm.moe's round: dispatch, the identity experts (untimed), combine."""
    def method(t: Timer):
        kw = dict(mode="low_latency", max_tokens_per_rank=cfg.tokens) \
            if cfg.mode == "low_latency" else {}
        d = t.phase("dispatch", lambda: ep.dispatch(x, idx, w, fp8=cfg.fp8, **kw))
        y = d.dequantized(x.dtype) if cfg.fp8 else d.x
        out = t.phase("combine", lambda: ep.combine(y, d))
        res["wrong"][PRIMARY] += _wrong(cfg, out, want)
        res["rows"] = int(d.count.sum()) if cfg.mode == "low_latency" else d.x.shape[0]
    return method


def _layer_method(name, comm, cfg, x, idx, w, el, want, res, a2a):
    """The all_to_all layer's round: ``a2a(tensor, send_counts, recv_counts)`` moves rows."""
    def method(t: Timer):
        send_tok, send, recv, got = t.phase("dispatch", lambda: permuted_dispatch(
            x, idx, w, el, comm.world_size, cfg.fp8, a2a))
        y = received_rows(got, cfg.fp8, x.dtype)
        out = t.phase("combine", lambda: permuted_combine(y, x, send_tok, send, recv, a2a))
        res["wrong"][name] += _wrong(cfg, out, want)
    return method


def rank_moe(comm, cfg: MoEBenchConfig, case=None) -> dict:
    """Run on every rank: tilecomm's rounds and the baselines', interleaved."""
    world = comm.world_size
    el = cfg.experts // world
    x, idx, w = _inputs(cfg, comm.rank)
    want = _expected(cfg, x, idx, w, el, world)
    ep = ExpertParallel(comm, num_experts=cfg.experts, hidden=cfg.hidden,
                        dtype=getattr(torch, cfg.dtype))
    res = {"wrong": {m: 0 for m in METHODS}, "rows": 0}
    methods = {PRIMARY: _tilecomm_method(cfg, ep, x, idx, w, want, res)}
    if cfg.baselines and cfg.mode == "normal":
        a2a_v = lambda t, send, recv: comm.all_to_all_v(t.contiguous(), send, recv)  # noqa
        for name, a2a in (("gloo", a2a_single), ("a2av", a2a_v)):
            methods[name] = _layer_method(name, comm, cfg, x, idx, w, el, want, res, a2a)
    with torch.no_grad():
        res["times"] = measure(comm.barrier, methods, cfg.rounds)
    return res


def summarize(cfg: MoEBenchConfig, per_rank: list[dict], rates: dict | None = None) -> dict:
    """The row: the shared timing fields (tilecomm.moe and its baselines, dispatch and
    combine), GB/s per phase and method, the memory bound."""
    itemsize = torch.empty((), dtype=getattr(torch, cfg.dtype)).element_size()
    rows = statistics.mean(r["rows"] for r in per_rank)
    disp_row = cfg.hidden + 4 * (cfg.hidden // 128) if cfg.fp8 else cfg.hidden * itemsize
    disp_bytes, comb_bytes = rows * disp_row, rows * cfg.hidden * itemsize
    out = harness.case_row(cfg.kind, cfg.id, per_rank, ["gloo", "a2av"], cfg.max_spread)
    out.update(world_size=cfg.world_size, hosts=cfg.hosts, tokens=cfg.tokens,
               hidden=cfg.hidden, topk=cfg.topk, experts=cfg.experts, mode=cfg.mode,
               fp8=cfg.fp8, dtype=cfg.dtype, rounds=cfg.rounds, rows_per_rank=rows,
               dispatch_bytes=disp_bytes, combine_bytes=comb_bytes)
    for m in METHODS:
        pre = "" if m == PRIMARY else f"{m}_"
        if f"{pre}dispatch_us" in out:
            out[f"{pre}dispatch_gbs"] = disp_bytes / out[f"{pre}dispatch_us"] / 1e3
            out[f"{pre}combine_gbs"] = comb_bytes / out[f"{pre}combine_us"] / 1e3
        out[f"{pre}wrong"] = sum(r["wrong"][m] for r in per_rank)
    out["wrong"] = sum(sum(r["wrong"].values()) for r in per_rank)
    if rates:
        out.update(_bound(cfg, disp_bytes, comb_bytes, itemsize, rates, out["time_us"] / 1e6))
    return out


def _bound(cfg, disp_bytes: float, comb_bytes: float, itemsize: int, rates: dict,
           t: float) -> dict:
    """Every received row byte written once at the copy rate (dispatch) and added once at
    the add rate (combine), on every rank, at the level the working set is held to (the
    tokens, what a rank receives and its combine output, every rank's together); at the
    ``dram`` level the compulsory traffic is the tokens read and the rows received written
    (dispatch), the rows read and the output written (combine)."""
    from .roofline import bound

    w = cfg.world_size
    mine = cfg.tokens * cfg.hidden * itemsize
    ws = w * (2 * mine + disp_bytes + comb_bytes)
    bd, level = bound([(disp_bytes, 0)] * w, [mine + disp_bytes] * w, rates, ws)
    bc, _ = bound([(0, comb_bytes)] * w, [comb_bytes + mine] * w, rates, ws)
    lv = rates[level]
    return {"bound_us": (bd + bc) * 1e6, "dispatch_bound_us": bd * 1e6,
            "combine_bound_us": bc * 1e6, "frac_of_bound": (bd + bc) / t, "bound_level": level,
            "copy_gbs": lv["copy"] / 1e9, "add_gbs": lv["add"] / 1e9}


def run(cfg: MoEBenchConfig) -> dict:
    """Start the ranks (local processes, or simulated hosts with ``cfg.hosts``), run
    :func:`rank_moe` on each, and return the row."""
    return harness.run(cfg)[0]


def table(rows: list[dict]):
    """The rich table ``tilecomm bench moe`` prints."""
    from .report import fmt, table as render

    c = rows[0]
    where = f"{len(c['hosts'])} simulated hosts" if c["hosts"] else "one host"
    title = (f"tilecomm moe: {c['world_size']} ranks on {where}, {c['tokens']} tokens x "
             f"{c['hidden']} ({c['dtype']}{', fp8 dispatch' if c['fp8'] else ''}), top-"
             f"{c['topk']} of {c['experts']} experts, {c['mode']} mode")
    lead = [("rows/rank", lambda r: f"{r['rows_per_rank']:.0f}")]
    mid = [("dispatch (ms)", lambda r: f"{r['dispatch_us'] / 1e3:.2f}"),
           ("combine (ms)", lambda r: f"{r['combine_us'] / 1e3:.2f}"),
           ("dispatch GB/s", lambda r: f"{r['dispatch_gbs']:.2f}"),
           ("combine GB/s", lambda r: f"{r['combine_gbs']:.2f}"),
           ("#wrong", lambda r: str(r["wrong"]))]
    tail = [("mem bound (ms)", lambda r: fmt(r.get("bound_us", 0) / 1e3 or None)),
            ("bound at", lambda r: r.get("bound_level", "")),
            ("% of bound", lambda r: fmt(100 * r["frac_of_bound"], ".0f") + "%"
             if "frac_of_bound" in r else "")]
    return render(rows, title, lead=lead, mid=mid, tail=tail, unit="ms",
                  notes=[f"{k}: {v}" for k, v in METHODS.items() if f"x_{k}" in c])

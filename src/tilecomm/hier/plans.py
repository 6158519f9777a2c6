"""Hierarchical algorithms: one definition per (collective, algorithm) over a :class:`HostLayout`.

A hierarchical algorithm is a list of *steps* that every rank walks in the same order:

* :class:`Copy` -- this rank rearranges chunks of its own buffers;
* :class:`Local` -- the ranks of each host run a tilecomm collective among themselves (over the
  host's symmetric heap, with the algorithm the local tuner picks);
* :class:`Rail` -- the members of a rail (one rank per host) exchange through torch.distributed
  (Gloo for CPU tensors, NCCL for CUDA tensors), after comparing a call header that carries
  the call's arguments, so ranks on different hosts that disagree raise ``CommMismatch``;
* :class:`Exchange` -- point-to-point blocks between ranks of different hosts (all_to_all).

Buffers are cut into chunks (``HierPlan.buffers``: name -> chunk count); a :class:`Region` is a
run of chunks. The same :class:`HierPlan` objects are executed by ``hier/backend.py`` and
*lowered* by :func:`flatten` into an ordinary :class:`~tilecomm.algorithms.schedule.Schedule`
(local steps embed the registered schedule of the host's sub-collective; rail and exchange
steps become direct moves between hosts), which the symbolic checker proves and the simulator
times: one definition, three consumers.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from typing import Callable

from ..algorithms.registry import get_schedule
from ..algorithms.schedule import BufferSpec, Loc, Move, Schedule
from .layout import HostLayout


@dataclass(frozen=True)
class Region:
    """Chunks ``[first, first + n)`` of buffer ``buf``."""

    buf: str
    first: int
    n: int = 1

    def chunk(self, i: int) -> Loc:
        return Loc(self.buf, self.first + i)


@dataclass(frozen=True)
class Copy:
    """``dst <- src`` for every pair, on this rank."""

    pairs: tuple[tuple[Region, Region], ...]


@dataclass(frozen=True)
class Local:
    """The host's ranks run ``collective`` (all_reduce, reduce_scatter, all_gather, broadcast,
    reduce, all_to_all, all_to_all_v); ``dst`` is None for in-place ones; ``root`` is a local
    rank. ``op``: "call" (the call's op, or sum when the op is avg: the division happens where
    the sum completes) or None."""

    collective: str
    src: Region
    dst: Region | None = None
    root: int = 0


@dataclass(frozen=True)
class RailPart:
    """One rail exchange: ``members`` (global ranks, host order); ``root`` a member (broadcast,
    reduce). ``lengths`` (all_gather): chunks member i contributes, placed at ``i * stride``."""

    rail: int
    members: tuple[int, ...]
    src: Region | None
    dst: Region | None
    root: int = -1
    lengths: tuple[int, ...] = ()
    stride: int = 0


@dataclass(frozen=True)
class Rail:
    """Inter-host step. ``kind``: all_reduce (dst = host-order reduction of every member's src),
    all_gather, reduce_scatter (member i gets part i of the reduction), all_to_all (member i
    gets part i of every member's src, in member order), broadcast, reduce, sync (headers
    only). ``completes``: the reduction is complete here (avg divides)."""

    kind: str
    parts: tuple[RailPart, ...]
    completes: bool = False


@dataclass(frozen=True)
class Exchange:
    """Blocks to and from ranks of other hosts: ``sends``/``recvs`` are ``(peer, Region)``."""

    sends: tuple[tuple[int, Region], ...]
    recvs: tuple[tuple[int, Region], ...]


Step = Copy | Local | Rail | Exchange


@dataclass(frozen=True)
class HierPlan:
    """Rank ``rank``'s steps of ``collective``/``algo`` on ``layout``."""

    collective: str
    algo: str
    layout: HostLayout
    root: int
    rank: int
    buffers: tuple[tuple[str, int], ...]     # name -> chunk count (user buffers first)
    steps: tuple[Step, ...]

    def nchunks(self, buf: str) -> int:
        return dict(self.buffers)[buf]


Builder = Callable[[HostLayout, int, int], tuple[dict[str, int], list[Step]]]
REGISTRY: dict[tuple[str, str], tuple[Builder, Callable[[HostLayout], bool]]] = {}


def register(collective: str, algo: str, *, even_only: bool = False):
    """Register ``fn(layout, root, rank) -> (buffers, steps)``."""
    def deco(fn):
        REGISTRY[(collective, algo)] = (fn, (lambda lay: lay.is_even) if even_only
                                         else (lambda lay: True))
        return fn
    return deco


def hier_algorithms(collective: str, layout: HostLayout | None = None) -> list[str]:
    """Hierarchical algorithms of ``collective`` (usable on ``layout`` when given)."""
    return [a for (c, a), (_, ok) in REGISTRY.items()
            if c == collective and (layout is None or ok(layout))]


@lru_cache(maxsize=4096)
def hier_plan(collective: str, algo: str, layout: HostLayout, root: int, rank: int) -> HierPlan:
    try:
        fn, ok = REGISTRY[(collective, algo)]
    except KeyError:
        raise ValueError(f"{collective}: no hierarchical algorithm {algo!r}; choose one of "
                         f"{', '.join(hier_algorithms(collective)) or 'none'}") from None
    if not ok(layout):
        raise ValueError(f"{collective}/{algo} needs the same number of ranks on every host "
                         f"(layout {layout.describe()}); use "
                         f"{', '.join(hier_algorithms(collective, layout))}")
    bufs, steps = fn(layout, root, rank)
    return HierPlan(collective, algo, layout, root, rank, tuple(bufs.items()), tuple(steps))


def _hl(lay: HostLayout, rank: int):
    h = lay.host_of(rank)
    return h, lay.local_rank(rank), lay.hosts[h]


def _rail_part(lay: HostLayout, c: int, src, dst, root: int = -1) -> RailPart:
    return RailPart(c, lay.rail(c), src, dst, root)


# ---- all_reduce -------------------------------------------------------------------------------
@register("all_reduce", "hier_rail", even_only=True)
def _all_reduce_rail(lay: HostLayout, root: int, rank: int):
    """Reduce-scatter inside the host, all-reduce chunk l on rail l, all-gather inside the host."""
    _, l, host = _hl(lay, rank)
    u = len(host)
    return {"buf": u, "t1": u, "t2": u}, [
        Local("reduce_scatter", Region("buf", 0, u), Region("t1", l)),
        Rail("all_reduce", (_rail_part(lay, l, Region("t1", l), Region("t2", l)),),
             completes=True),
        Local("all_gather", Region("t2", l), Region("buf", 0, u)),
    ]


@register("all_reduce", "hier_rail_first", even_only=True)
def _all_reduce_rail_first(lay: HostLayout, root: int, rank: int):
    """Small messages: all-reduce the whole buffer on rail l first (one inter-host round,
    every rank busy), then inside the host (one local call): two synchronizations in all."""
    _, l, _ = _hl(lay, rank)
    buf, t1 = Region("buf", 0), Region("t1", 0)
    return {"buf": 1, "t1": 1}, [
        Rail("all_reduce", (_rail_part(lay, l, buf, t1),), completes=True),
        Local("all_reduce", t1),
        Copy(((buf, t1),)),
    ]


@register("all_reduce", "hier_leader")
def _all_reduce_leader(lay: HostLayout, root: int, rank: int):
    """Reduce to local rank 0, all-reduce among the hosts' rank 0s (rail 0), broadcast."""
    _, l, _ = _hl(lay, rank)
    buf, t1 = Region("buf", 0), Region("t1", 0)
    steps: list[Step] = [Local("reduce", buf, None, 0)]
    if l == 0:
        steps += [Rail("all_reduce", (_rail_part(lay, 0, buf, t1),), completes=True),
                  Copy(((buf, t1),))]
    else:
        steps += [Rail("all_reduce", (), completes=True), Copy(())]
    steps.append(Local("broadcast", buf, None, 0))
    return {"buf": 1, "t1": 1}, steps


# ---- all_gather -------------------------------------------------------------------------------
@register("all_gather", "hier_rail", even_only=True)
def _all_gather_rail(lay: HostLayout, root: int, rank: int):
    """All-gather on rail l (every host's local rank l), then inside the host, then reorder."""
    _, l, host = _hl(lay, rank)
    nh, u, w = lay.num_hosts, len(host), lay.world_size
    perm = tuple((Region("out", lay.hosts[h][j]), Region("t2", j * nh + h))
                 for j in range(u) for h in range(nh))
    return {"in": 1, "out": w, "t1": nh, "t2": w}, [
        Rail("all_gather", (_rail_part(lay, l, Region("in", 0), Region("t1", 0, nh)),)),
        Local("all_gather", Region("t1", 0, nh), Region("t2", 0, w)),
        Copy(perm),
    ]


@register("all_gather", "hier_leader")
def _all_gather_leader(lay: HostLayout, root: int, rank: int):
    """All-gather inside the host, host blocks among the hosts' rank 0s, broadcast, reorder."""
    h, l, host = _hl(lay, rank)
    lm, w, nh = lay.max_local, lay.world_size, lay.num_hosts
    bufs = {"in": 1, "out": w, "t1": lm, "t2": nh * lm}
    steps: list[Step] = [Local("all_gather", Region("in", 0), Region("t1", 0, len(host)))]
    if l == 0:
        part = RailPart(0, lay.rail(0), Region("t1", 0, len(host)), Region("t2", 0, nh * lm),
                        lengths=tuple(len(x) for x in lay.hosts), stride=lm)
        perm = tuple((Region("out", lay.hosts[g][j]), Region("t2", g * lm + j))
                     for g in range(nh) for j in range(len(lay.hosts[g])))
        steps += [Rail("all_gather", (part,)), Copy(perm)]
    else:
        steps += [Rail("all_gather", ()), Copy(())]
    steps.append(Local("broadcast", Region("out", 0, w), None, 0))
    return bufs, steps


# ---- reduce_scatter ---------------------------------------------------------------------------
@register("reduce_scatter", "hier_rail", even_only=True)
def _reduce_scatter_rail(lay: HostLayout, root: int, rank: int):
    """Reorder so part j holds rail j's chunks, reduce-scatter inside the host, then across
    the hosts on rail l."""
    _, l, host = _hl(lay, rank)
    nh, u, w = lay.num_hosts, len(host), lay.world_size
    perm = tuple((Region("t1", j * nh + h), Region("in", lay.hosts[h][j]))
                 for j in range(u) for h in range(nh))
    return {"in": w, "out": 1, "t1": w, "t2": nh}, [
        Copy(perm),
        Local("reduce_scatter", Region("t1", 0, w), Region("t2", 0, nh)),
        Rail("reduce_scatter", (_rail_part(lay, l, Region("t2", 0, nh), Region("out", 0)),),
             completes=True),
    ]


@register("reduce_scatter", "hier_leader")
def _reduce_scatter_leader(lay: HostLayout, root: int, rank: int):
    """Reduce to local rank 0, all-reduce among the hosts' rank 0s, broadcast, keep own chunk."""
    _, l, _ = _hl(lay, rank)
    w = lay.world_size
    t1, t2 = Region("t1", 0, w), Region("t2", 0, w)
    steps: list[Step] = [Copy(((t1, Region("in", 0, w)),)), Local("reduce", t1, None, 0)]
    steps.append(Rail("all_reduce", (_rail_part(lay, 0, t1, t2),) if l == 0 else (),
                      completes=True))
    steps += [Local("broadcast", t2, None, 0), Copy(((Region("out", 0), Region("t2", rank)),))]
    return {"in": w, "out": 1, "t1": w, "t2": w}, steps


# ---- broadcast / reduce -----------------------------------------------------------------------
@register("broadcast", "hier_rail")
def _broadcast_rail(lay: HostLayout, root: int, rank: int):
    """Broadcast on the root's rail, then inside every host from that rail's member."""
    _, l, host = _hl(lay, rank)
    c = lay.local_rank(root)
    buf = Region("buf", 0)
    mine = rank in lay.rail(c)
    return {"buf": 1}, [
        Rail("broadcast", (_rail_part(lay, c, buf, buf, root),) if mine else ()),
        Local("broadcast", buf, None, c % len(host)),
    ]


@register("reduce", "hier_rail")
def _reduce_rail(lay: HostLayout, root: int, rank: int):
    """Reduce inside every host to the root's rail, then across the hosts on that rail."""
    _, l, host = _hl(lay, rank)
    c = lay.local_rank(root)
    buf, t1 = Region("buf", 0), Region("t1", 0)
    mine = rank in lay.rail(c)
    return {"buf": 1, "t1": 1}, [
        Copy(((t1, buf),)),
        Local("reduce", t1, None, c % len(host)),
        Rail("reduce", (_rail_part(lay, c, t1, buf, root),) if mine else (), completes=True),
    ]


# ---- all_to_all(_v) ---------------------------------------------------------------------------
def _all_to_all_direct(lay: HostLayout, root: int, rank: int, collective: str):
    """Blocks for ranks of this host through the heap (local all_to_all), blocks for other
    hosts straight to their ranks (torch.distributed point-to-point), after a header check
    on the rails (so hosts that disagree raise instead of exchanging mismatched sizes)."""
    _, l, host = _hl(lay, rank)
    w, u = lay.world_size, len(host)
    contiguous = list(host) == list(range(host[0], host[0] + u))
    if contiguous:      # the host's blocks are adjacent in the caller's buffers
        src, dst = Region("in", host[0], u), Region("out", host[0], u)
        pre = post = ()
    else:
        src, dst = Region("t1", 0, u), Region("t2", 0, u)
        pre = tuple((Region("t1", j), Region("in", p)) for j, p in enumerate(host))
        post = tuple((Region("out", p), Region("t2", j)) for j, p in enumerate(host))
    steps: list[Step] = [Copy(pre), Local(collective, src, dst), Copy(post)]
    steps.append(Rail("sync", tuple(_rail_part(lay, c, None, None) for c in lay.rails_of(rank))))
    others = [p for p in range(w) if lay.host_of(p) != lay.host_of(rank)]
    steps.append(Exchange(tuple((p, Region("in", p)) for p in others),
                          tuple((p, Region("out", p)) for p in others)))
    return {"in": w, "out": w, "t1": lay.max_local, "t2": lay.max_local}, steps


@register("all_to_all", "hier_direct")
def _all_to_all(lay, root, rank):
    return _all_to_all_direct(lay, root, rank, "all_to_all")


@register("all_to_all", "hier_rail", even_only=True)
def _all_to_all_rail(lay: HostLayout, root: int, rank: int):
    """Each block crosses the network once, on its destination's rail, and each rank sends
    one message per other host (not one per rank there): inside the host, local rank j
    collects every host rank's blocks for the ranks of rail j (one local all_to_all); then
    the members of rail j exchange them. A small call's blocks travel in the rail's header
    round: one inter-host round in all, against two for hier_direct (header, then data)."""
    _, c, host = _hl(lay, rank)
    nh, u, w = lay.num_hosts, len(host), lay.world_size
    # t1: this rank's blocks grouped by local destination j (for ranks (g, j), g = 0..nh-1)
    pre = tuple((Region("t1", j * nh + g), Region("in", lay.hosts[g][j]))
                for j in range(u) for g in range(nh))
    # t2 (after the local step): block from local rank i for rank (g, c) at i * nh + g;
    # t3: the same blocks grouped by destination host g (the message to rail member g)
    mid = tuple((Region("t3", g * u + i), Region("t2", i * nh + g))
                for g in range(nh) for i in range(u))
    # rail member g's message holds the blocks of ranks (g, 0..u-1): where hosts are
    # consecutive ranks they land straight in the output
    contiguous = all(list(hs) == list(range(g * u, (g + 1) * u))
                     for g, hs in enumerate(lay.hosts))
    dst = Region("out", 0, w) if contiguous else Region("t4", 0, w)
    post = () if contiguous else tuple((Region("out", lay.hosts[g][i]), Region("t4", g * u + i))
                                       for g in range(nh) for i in range(u))
    return {"in": w, "out": w, "t1": w, "t2": w, "t3": w, "t4": w}, [
        Copy(pre),
        Local("all_to_all", Region("t1", 0, w), Region("t2", 0, w)),
        Copy(mid),
        Rail("all_to_all", (_rail_part(lay, c, Region("t3", 0, w), dst),)),
        Copy(post),
    ]


@register("all_to_all_v", "hier_direct")
def _all_to_all_v(lay, root, rank):
    return _all_to_all_direct(lay, root, rank, "all_to_all_v")


@register("barrier", "hier_rail")
def _barrier(lay: HostLayout, root: int, rank: int):
    """Every host's ranks meet, then every rail's members (each rank sits on a rail, and
    every rail member has passed its host's meeting)."""
    return {}, [Local("barrier", Region("none", 0, 0)),
                Rail("sync", tuple(_rail_part(lay, c, None, None)
                                   for c in lay.rails_of(rank)))]


# ---- lowering to a flat schedule ---------------------------------------------------------------
def default_local_algo(collective: str, world_size: int) -> str:
    return {"all_reduce": "one_shot", "broadcast": "direct", "reduce": "direct",
            "all_to_all_v": "direct"}.get(collective, "direct")


def flatten(collective: str, algo: str, layout: HostLayout, root: int = 0,
            local_algo: Callable[[str, int], str] = default_local_algo) -> Schedule:
    """The flat :class:`Schedule` of a hierarchical algorithm over all ranks: what the checker
    proves and the simulator times. Inter-host moves are those whose source is on another
    host (``Schedule.meta["hosts"]`` holds the layout)."""
    w = layout.world_size
    plans = [hier_plan(collective, algo, layout, root, r) for r in range(w)]
    nsteps = {len(p.steps) for p in plans}
    assert len(nsteps) == 1, f"{collective}/{algo}: ranks have different step counts"
    bufs: dict[str, int] = dict(plans[0].buffers)
    bufs.pop("none", None)
    phases: list[list[Move]] = []
    for i in range(nsteps.pop()):
        steps = [p.steps[i] for p in plans]
        kinds = {type(s) for s in steps}
        assert len(kinds) == 1, f"{collective}/{algo}: step {i} differs in kind between ranks"
        kind = kinds.pop()
        if kind is Copy:
            phases.append([Move(r, d.chunk(j), r, s.chunk(j))
                           for r, st in enumerate(steps) for d, s in st.pairs for j in range(d.n)])
        elif kind is Local:
            phases.extend(_flatten_local(layout, steps, i, bufs, local_algo))
        elif kind is Rail:
            phases.extend(_flatten_rail(steps, w))
        else:
            phases.append([Move(r, d.chunk(j), p, plans[p].steps[i].sends[_index(
                plans[p].steps[i].sends, r)][1].chunk(j))
                for r, st in enumerate(steps) for p, d in st.recvs for j in range(d.n)])
    buffers = tuple(BufferSpec(n, c) for n, c in bufs.items())
    return Schedule(collective, algo, w, buffers, tuple(tuple(p) for p in phases if p), root,
                    meta={"hosts": layout})


def _index(pairs, peer: int) -> int:
    return next(i for i, (p, _) in enumerate(pairs) if p == peer)


def _flatten_local(layout, steps, i, bufs, local_algo) -> list[list[Move]]:
    out: list[list[Move]] = []
    for h, host in enumerate(layout.hosts):
        st = steps[host[0]]
        if st.collective == "barrier":
            continue
        sub = get_schedule(st.collective, local_algo(st.collective, len(host)), len(host),
                           st.root)
        user = ("buf",) if st.dst is None else ("in", "out")
        regions = [(st.src,) if st.dst is None else (st.src, st.dst)
                   for st in (steps[r] for r in host)]
        mult = {}
        for k, name in enumerate(user):
            mult[name] = regions[0][k].n // sub.buffer(name).nchunks
        for b in sub.buffers:
            if b.name not in mult:
                mult[b.name] = mult[b.like] if b.like else 1
                bufs[f"s{i}h{h}.{b.name}"] = b.nchunks * mult[b.name]

        def glob(sr: int, loc: Loc, t: int) -> Loc:
            m = mult[loc.buf]
            if loc.buf in user:
                reg = regions[sr][user.index(loc.buf)]
                return reg.chunk(loc.chunk * m + t)
            return Loc(f"s{i}h{h}.{loc.buf}", loc.chunk * m + t)

        for p in range(len(sub.phases)):
            while len(out) <= p:
                out.append([])
            for lr in range(len(host)):
                for red in sub.reductions_of(lr, p):
                    for t in range(mult[red.dst.buf]):
                        dst = glob(lr, red.dst, t)
                        for k, (sr, loc) in enumerate(red.srcs):
                            out[p].append(Move(host[lr], dst, host[sr], glob(sr, loc, t),
                                               reduce=red.accumulate or k > 0))
    return out


def _flatten_rail(steps, w: int) -> list[list[Move]]:
    moves: list[Move] = []
    done = set()
    for st in steps:
        for part in st.parts:
            key = part.rail
            if key in done or st.kind == "sync":
                continue
            done.add(key)
            mem = part.members
            regs = {m: next(p for p in steps[m].parts if p.rail == key) for m in mem}
            for i, dst_rank in enumerate(mem):
                d = regs[dst_rank].dst
                if st.kind == "all_reduce" or (st.kind == "reduce" and dst_rank == part.root):
                    for j in range(d.n):
                        for k, s in enumerate(mem):
                            moves.append(Move(dst_rank, d.chunk(j), s, regs[s].src.chunk(j),
                                              reduce=k > 0))
                elif st.kind == "reduce_scatter":
                    for j in range(d.n):
                        for k, s in enumerate(mem):
                            moves.append(Move(dst_rank, d.chunk(j), s,
                                              regs[s].src.chunk(i * d.n + j), reduce=k > 0))
                elif st.kind == "all_gather":
                    stride = part.stride or regs[mem[0]].src.n
                    for k, s in enumerate(mem):
                        n = part.lengths[k] if part.lengths else regs[s].src.n
                        for j in range(n):
                            moves.append(Move(dst_rank, d.chunk(k * stride + j), s,
                                              regs[s].src.chunk(j)))
                elif st.kind == "all_to_all":      # member i gets part i of every src
                    n = d.n // len(mem)
                    for k, s in enumerate(mem):
                        for j in range(n):
                            moves.append(Move(dst_rank, d.chunk(k * n + j), s,
                                              regs[s].src.chunk(i * n + j)))
                elif st.kind == "broadcast" and dst_rank != part.root:
                    for j in range(d.n):
                        moves.append(Move(dst_rank, d.chunk(j), part.root,
                                          regs[part.root].src.chunk(j)))
    return [moves]

"""Soak: a seeded random mix of calls, each checked against :mod:`tilecomm.reference`.

Call ``i`` of seed ``s`` is drawn from its own generator (``spec(s, world_size, i)``), so every
rank draws the same call without talking, and one failing call can be rerun alone. A call picks
a collective (every collective, ``barrier``, and a ``send``/``recv`` pair), an algorithm (every
registered one, and ``auto``), a dtype the collective accepts, a size (0, 1, small odd sizes,
sizes that run in several scratch pieces), a reduction op and root, and where its tensors live:
the symmetric heap (``comm.alloc``) or ordinary memory, contiguous or strided (a step-2 view,
a column slice, or one element with a non-unit stride). Some reducing calls run in
deterministic mode on random floats and must give the bits of
:func:`reference.rank_order_reduced`; the others use small integers, whose reductions are exact
in every dtype, and must equal :func:`reference.reduced` exactly.

Used by ``tests/runtime/test_soak.py`` (a few thousand calls) and ``scripts/soak.py`` (long runs).
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

import torch

from . import reference
from .algorithms.lower import deterministic_algorithms
from .algorithms.registry import algorithms

COLLECTIVES = ("all_reduce", "all_gather", "reduce_scatter", "broadcast", "reduce",
               "all_to_all", "all_to_all_v", "barrier", "send_recv")
REDUCING = ("all_reduce", "reduce_scatter", "reduce")
REDUCIBLE = (torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int32,
             torch.int64)
MOVABLE = REDUCIBLE + (torch.uint8, torch.int8)
OPS = ("sum", "prod", "min", "max", "avg")
#: layouts of a tensor: "contig", "step2" (every other element of a buffer twice as long),
#: "column" (a column slice of a wider 2-d buffer: rows keep a non-unit stride)
LAYOUTS = ("contig", "contig", "step2", "column")


@dataclass(frozen=True)
class Spec:
    """One drawn call. ``rows`` x ``cols`` is the per-rank input shape (``cols`` 0: 1-d;
    ``rows`` -1: a 0-d tensor); ``counts[i][j]`` are all_to_all_v's rows from rank i to j."""

    index: int
    collective: str
    algo: str = "auto"
    dtype: torch.dtype = torch.float32
    op: str = "sum"
    root: int = 0
    rows: int = 0
    cols: int = 0
    heap: bool = False
    layout: str = "contig"
    out: str = "none"             # none | given | heap (an out= tensor, where there is one)
    deterministic: bool = False
    peers: tuple[int, int] = (0, 0)
    counts: tuple[tuple[int, ...], ...] = ()
    seed: int = field(default=0, compare=False)

    def shape(self) -> tuple[int, ...]:
        if self.rows < 0:
            return ()
        return (self.rows, self.cols) if self.cols else (self.rows,)

    def __str__(self) -> str:
        where = "heap" if self.heap else "ordinary"
        text = (f"call {self.index} (seed {self.seed}): {self.collective} algo={self.algo} "
                f"{str(self.dtype).removeprefix('torch.')} shape={self.shape()} {where} "
                f"{self.layout}")
        if self.collective in REDUCING:
            text += f" op={self.op}"
        if self.collective in ("broadcast", "reduce"):
            text += f" root={self.root}"
        if self.deterministic:
            text += " deterministic"
        if self.collective == "send_recv":
            text += f" {self.peers[0]}->{self.peers[1]}"
        if self.counts:
            text += f" counts={[list(c) for c in self.counts]}"
        return text


def _size(rng: random.Random) -> int:
    """Element counts: 0 and 1 often, small odd sizes, now and then several scratch pieces."""
    r = rng.random()
    if r < 0.12:
        return 0
    if r < 0.25:
        return 1
    if r < 0.85:
        return rng.randrange(2, 400) | 1
    if r < 0.97:
        return rng.randrange(400, 5000)
    return rng.randrange(20_000, 24_000) | 1      # > the 64 KiB test scratch in float64


def spec(seed: int, world_size: int, index: int, auto_only: bool = False) -> Spec:
    """Call ``index`` of the soak with ``seed`` on ``world_size`` ranks (same on every rank).
    ``auto_only``: every call with ``algo="auto"`` and outside deterministic mode (ranks that
    span hosts run the hierarchical algorithms, which auto picks among)."""
    rng = random.Random(f"tilecomm-soak:{seed}:{world_size}:{index}")
    names = [c for c in COLLECTIVES if c != "send_recv" or world_size > 1]
    coll = rng.choice(names)
    base = dict(index=index, collective=coll, seed=seed)
    if coll == "barrier":
        return Spec(**base)
    reducing = coll in REDUCING
    dtype = rng.choice(REDUCIBLE if reducing else MOVABLE)
    op = "sum"
    if reducing:
        op = rng.choice([o for o in OPS if o != "avg" or dtype.is_floating_point])
    det = reducing and dtype.is_floating_point and rng.random() < 0.2
    algos = algorithms(coll) if coll != "send_recv" else ["auto"]
    root = rng.randrange(world_size)
    if det:
        algos = deterministic_algorithms(coll, world_size, root)
    algo = rng.choice(list(algos) + ["auto"])
    cols = rng.choice([0, 0, 1, 2, 3, 5])
    n = _size(rng)
    if coll in ("reduce_scatter", "all_to_all"):
        rows = (n // max(cols, 1) // world_size) * world_size
    else:
        rows = n // max(cols, 1) if cols else n
    if coll in ("all_reduce", "broadcast", "reduce", "all_gather") and rng.random() < 0.03:
        rows, cols = -1, 0                      # a 0-d tensor
    counts: tuple = ()
    if coll == "all_to_all_v":
        rows = 0
        per = [[rng.choice([0, 0, 1, 2, rng.randrange(3, 60)]) for _ in range(world_size)]
               for _ in range(world_size)]
        counts = tuple(tuple(c) for c in per)
    layout = rng.choice(LAYOUTS)
    if layout == "column" and cols == 0:
        layout = "step2"
    peers = tuple(rng.sample(range(world_size), 2)) if coll == "send_recv" else (0, 0)
    out = rng.choice(["none", "given", "heap"]) \
        if coll in ("all_gather", "reduce_scatter", "all_to_all") else "none"
    if auto_only:
        algo, det = "auto", False
    return Spec(**base, algo=algo, dtype=dtype, op=op, root=root, rows=rows, cols=cols,
                heap=rng.random() < 0.3 and coll != "send_recv", layout=layout, out=out,
                deterministic=det, peers=peers, counts=counts)


def values(s: Spec, rank: int, shape) -> torch.Tensor:
    """Rank ``rank``'s input of call ``s`` (contiguous): small integers whose reductions are
    exact in every dtype (prod: products of -1, 1, 2), or normal floats in deterministic mode."""
    g = torch.Generator().manual_seed((s.seed * 1_000_003 + s.index) * 64 + rank)
    if s.deterministic:
        return torch.randn(shape, generator=g, dtype=torch.float64).to(s.dtype)
    if s.op == "prod":
        vals = torch.tensor([-1, 1, 2, 1])[torch.randint(0, 4, shape, generator=g)]
    else:
        vals = torch.randint(0 if s.dtype == torch.uint8 else -8, 9, shape, generator=g)
    return vals.to(s.dtype)


def _place(comm, s: Spec, data: torch.Tensor, heap: bool, layout: str,
           heap_rows: int | None = None) -> torch.Tensor:
    """``data`` copied into a tensor with ``layout``, in the symmetric heap when ``heap``
    (collective: every rank allocates alike, which holds because the spec is the same; ranks
    whose row counts differ allocate ``heap_rows`` rows and use the first ones)."""
    shape = tuple(data.shape)

    def buffer(shape_):
        if heap and not shape_:
            return comm.alloc((), s.dtype)
        if heap:
            rows = shape_[0]
            if heap_rows is not None:
                rows = heap_rows * (2 if layout == "step2" else 1)
            return comm.alloc((rows, *shape_[1:]), s.dtype)[:shape_[0]]
        return torch.zeros(shape_, dtype=s.dtype)

    if layout == "contig" or not shape:
        t = buffer(shape)
    elif layout == "step2":
        t = buffer((2 * shape[0], *shape[1:]))[::2]
    else:                                       # column: rows keep the wider row's stride
        t = buffer((shape[0], shape[1] + 2))[:, 1:1 + shape[1]]
    t.copy_(data)
    return t


def _out(comm, s: Spec, shape) -> torch.Tensor | None:
    if s.out == "none":
        return None
    if s.out == "heap":
        return comm.alloc(shape, s.dtype)
    return torch.empty(shape, dtype=s.dtype)


def run_call(comm, s: Spec) -> str | None:
    """Run call ``s`` on this rank; a description of what is wrong, or None when right."""
    w, r = comm.world_size, comm.rank
    c = s.collective
    if c == "barrier":
        comm.barrier()
        return None
    if c == "send_recv":
        src, dst = s.peers
        shape = s.shape()
        if r == src:
            comm.send(_place(comm, s, values(s, src, shape), False, s.layout), dst)
        elif r == dst:
            got = _place(comm, s, torch.zeros(shape, dtype=s.dtype), False, s.layout)
            comm.recv(got, src)
            return _compare(got, values(s, src, shape), s, "recv")
        return None
    if c == "all_to_all_v":
        ins = [values(s, i, (sum(s.counts[i]), 3)) for i in range(w)]
        t = _place(comm, s, ins[r], s.heap, s.layout,
                   heap_rows=max(sum(c) for c in s.counts))
        got = comm.all_to_all_v(t, list(s.counts[r]), algo=s.algo)
        want = reference.all_to_all_v(ins, s.counts)[r]
        return _compare(got, want, s, "output")
    shape = s.shape()
    ins = [values(s, i, shape) for i in range(w)]
    t = _place(comm, s, ins[r], s.heap, s.layout)
    before = t.clone()
    if c == "all_gather":
        rows = w * shape[0] if shape else w
        got = comm.all_gather(t, out=_out(comm, s, (rows, *shape[1:])), algo=s.algo)
        return _compare(got, reference.all_gather(ins)[r], s, "output") or \
            _compare(t, before, s, "input (modified)")
    if c == "all_to_all":
        got = comm.all_to_all(t, out=_out(comm, s, shape), algo=s.algo)
        return _compare(got, reference.all_to_all(ins)[r], s, "output") or \
            _compare(t, before, s, "input (modified)")
    comm.deterministic = s.deterministic
    try:
        if c == "reduce_scatter":
            out = _out(comm, s, (shape[0] // w, *shape[1:]))
            got = comm.reduce_scatter(t, s.op, out=out, algo=s.algo)
            want = _reduced(ins, s).chunk(w)[r] if shape[0] else _reduced(ins, s)[:0]
            return _compare(got, want, s, "output") or _compare(t, before, s, "input (modified)")
        if c == "all_reduce":
            comm.all_reduce(t, s.op, algo=s.algo)
            return _compare(t, _reduced(ins, s), s, "result")
        if c == "broadcast":
            comm.broadcast(t, s.root, algo=s.algo)
            return _compare(t, ins[s.root], s, "result")
        comm.reduce(t, s.root, s.op, algo=s.algo)
        return _compare(t, _reduced(ins, s) if r == s.root else ins[r], s, "result")
    finally:
        comm.deterministic = False


def _reduced(ins, s: Spec) -> torch.Tensor:
    if s.deterministic:
        return reference.rank_order_reduced(ins, s.op)
    return reference.reduced(ins, s.op)


def _compare(got: torch.Tensor, want: torch.Tensor, s: Spec, what: str) -> str | None:
    """Exact bits (NaN never occurs: the data are finite and so are their reductions)."""
    if tuple(got.shape) != tuple(want.shape) or got.dtype != want.dtype:
        return f"{s}: {what} has shape {tuple(got.shape)} {got.dtype}, want " \
               f"{tuple(want.shape)} {want.dtype}"
    if not torch.equal(got, want):
        bad = (got != want).nonzero()
        return f"{s}: {what} differs at {bad.shape[0]} of {want.numel()} elements, first " \
               f"{tuple(bad[0].tolist())}: got {got[tuple(bad[0])].item()}, want " \
               f"{want[tuple(bad[0])].item()}"
    return None


def soak_rank(comm, seed: int, start: int, count: int, auto_only: bool = False) -> dict:
    """Run calls ``start .. start+count-1`` of ``seed`` on this rank (every rank calls it;
    ``auto_only``: see :func:`spec`).

    Returns ``{"calls": count, "wrong": [descriptions], "by_collective": {name: calls}}``. A call
    that raises re-raises with its description attached (a note), so the launcher's RankError
    says which call it was.
    """
    wrong: list[str] = []
    by: dict[str, int] = {}
    for i in range(start, start + count):
        s = spec(seed, comm.world_size, i, auto_only)
        by[s.collective] = by.get(s.collective, 0) + 1
        try:
            bad = run_call(comm, s)
        except Exception as e:
            e.add_note(f"tilecomm soak, rank {comm.rank}: {s}")
            raise
        if bad is not None:
            wrong.append(f"rank {comm.rank}: {bad}")
    return {"calls": count, "wrong": wrong, "by_collective": by}

"""One case table for ``tilecomm bench`` and ``scripts/gpu_check.py``: per operation how to make
its buffers for a size, run it with tilecomm and with a torch.distributed baseline, and what every
rank must hold afterwards; and the rows of the table (:class:`BenchCase`), named by one id.

``size`` is nccl-tests' size column: the bytes of the largest buffer of the call (the output of
all_gather, the input of reduce_scatter and all_to_all, the buffer of all_reduce, broadcast,
reduce, and the message of send_recv).

A case id reads ``op/algo[/redop]/dtype/mem/size/wN``, e.g. ``all_reduce/one_shot/sum/float32/
heap/8K/w2`` (``redop`` only for reducing operations). ``tilecomm bench`` builds its table from
its arguments (:func:`bench_table`), gpu_check from the registered GPU kernels
(:func:`kernel_table`); both run a row with the same rank-side code (``bench.runner``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch

from .. import reference
from ..algorithms.collectives import BUSBW_FACTOR
from ..units import format_size

#: written into outputs before a checked call: an element the call did not write shows up
POISON = 111


def exact_data(seed: int, rank: int, count: int, dtype: torch.dtype,
               redop: str = "sum") -> torch.Tensor:
    """Small integers (fresh per ``seed``): sums over any number of ranks (<= 16) in any order
    are exact in every dtype, so checks compare bits. For ``prod`` the values are +-1 and +-2
    (no zeros, and products of up to 8 ranks stay within bf16's exact integers)."""
    g = torch.Generator().manual_seed(seed * 7919 + rank)
    if redop == "prod":
        v = torch.tensor([-2, -1, 1, 2])[torch.randint(0, 4, (count,), generator=g)]
        return v.to(dtype)
    return torch.randint(-3, 4, (count,), generator=g).to(dtype)


@dataclass
class Buffers:
    inp: torch.Tensor
    out: torch.Tensor | None = None
    root: int = 0
    redop: str = "sum"
    #: all_to_all_v: 0 = the timing split (uneven_rows); else the seed of a random split
    split_seed: int = 0


@dataclass(frozen=True)
class Case:
    name: str
    #: elements per rank of the input for a size (in elements of the largest buffer)
    in_count: Callable[[int, int], int]
    #: elements of the output (None: in place)
    out_count: Callable[[int, int], int] | None
    run: Callable            # (comm, bufs, algo) -> None
    baseline: Callable       # (dist, bufs, group=None) -> None  (torch.distributed)
    expected: Callable       # (inputs: list[Tensor], rank, world, bufs) -> Tensor
    reduces: bool = False
    #: the call writes its result over its input (all_reduce, broadcast, reduce)
    in_place: bool = False

    def factor(self, world: int) -> float:
        return BUSBW_FACTOR[self.name](world)


def _red(xs, bufs):
    """Every rank's inputs reduced as the kernels and the executor do: in rank order, 16-bit
    floats accumulated in float32, avg divided before the one rounding."""
    return reference.rank_order_reduced(xs, bufs.redop)


def _first(dist, group) -> int:
    """The global rank of ``group``'s rank 0 (the baselines' root)."""
    return 0 if group is None else dist.get_global_rank(group, 0)


def _a2a_expected(inputs, r, w, b):
    return torch.cat([x.chunk(w)[r] for x in inputs])


def uneven_rows(total: int, world: int, rank: int) -> list[int]:
    """Rows ``rank`` sends to each peer in the all_to_all_v benchmark: uneven (weights
    1..world rotating with the rank) and summing to ``total``."""
    weights = [1 + (rank + j) % world for j in range(world)]
    rows = [total * wt // sum(weights) for wt in weights]
    rows[-1] += total - sum(rows)
    return rows


def random_rows(total: int, world: int, rank: int, seed: int) -> list[int]:
    """A random split of ``total`` rows over ``world`` peers, zeros included (checked calls)."""
    g = torch.Generator().manual_seed(seed * 31 + rank)
    wts = torch.randint(0, 4, (world,), generator=g)
    wts[torch.randint(0, world, (1,), generator=g)] += 1       # never all zero
    rows = (wts * total // wts.sum()).tolist()
    rows[int(torch.argmax(wts))] += total - sum(rows)
    return rows


def _split(n, w, r, b):
    return uneven_rows(n, w, r) if not b.split_seed else random_rows(n, w, r, b.split_seed)


def _a2av(comm, b, algo):
    w, r = comm.world_size, comm.rank
    n = b.inp.numel()
    send = _split(n, w, r, b)
    recv = [_split(n, w, j, b)[r] for j in range(w)]
    if b.out is None or b.out.numel() != sum(recv):
        b.out = torch.full((sum(recv),), POISON, dtype=b.inp.dtype, device=b.inp.device)
    comm.all_to_all_v(b.inp, send, recv, out=b.out, algo=algo)


def _a2av_baseline(dist, b, group=None):
    w, r = dist.get_world_size(group), dist.get_rank(group)
    n = b.inp.numel()
    send = uneven_rows(n, w, r)
    recv = [uneven_rows(n, w, j)[r] for j in range(w)]
    if b.out is None or b.out.numel() != sum(recv):
        b.out = torch.empty(sum(recv), dtype=b.inp.dtype, device=b.inp.device)
    dist.all_to_all_single(b.out, b.inp, recv, send, group=group)


def _a2av_expected(inputs, r, w, b):
    parts = [torch.split(x, _split(x.numel(), w, j, b))[r] for j, x in enumerate(inputs)]
    return torch.cat(parts)


def _sendrecv(comm, b, algo):
    w, r = comm.world_size, comm.rank
    if w == 1:
        b.out.copy_(b.inp)
        return
    nxt, prv = (r + 1) % w, (r - 1) % w
    if r % 2 == 0:
        comm.send(b.inp, nxt)
        comm.recv(b.out, prv)
    else:
        comm.recv(b.out, prv)
        comm.send(b.inp, nxt)


def _sendrecv_baseline(dist, b, group=None):
    w, r = dist.get_world_size(group), dist.get_rank(group)
    if w == 1:
        b.out.copy_(b.inp)
        return
    peer = (lambda q: q) if group is None else (lambda q: dist.get_global_rank(group, q))
    reqs = [dist.isend(b.inp, peer((r + 1) % w), group=group),
            dist.irecv(b.out, peer((r - 1) % w), group=group)]
    for q in reqs:
        q.wait()


CASES: dict[str, Case] = {c.name: c for c in [
    Case("all_reduce", lambda n, w: n, None,
         lambda comm, b, algo: comm.all_reduce(b.inp, b.redop, algo=algo),
         lambda dist, b, group=None: dist.all_reduce(b.inp, group=group),
         lambda xs, r, w, b: _red(xs, b), reduces=True, in_place=True),
    Case("all_gather", lambda n, w: n // w, lambda n, w: n,
         lambda comm, b, algo: comm.all_gather(b.inp, b.out, algo=algo),
         lambda dist, b, group=None: dist.all_gather_into_tensor(b.out, b.inp, group=group),
         lambda xs, r, w, b: torch.cat(xs)),
    Case("reduce_scatter", lambda n, w: n, lambda n, w: n // w,
         lambda comm, b, algo: comm.reduce_scatter(b.inp, b.redop, out=b.out, algo=algo),
         lambda dist, b, group=None: dist.reduce_scatter_tensor(b.out, b.inp, group=group),
         lambda xs, r, w, b: _red(xs, b).chunk(w)[r], reduces=True),
    Case("broadcast", lambda n, w: n, None,
         lambda comm, b, algo: comm.broadcast(b.inp, b.root, algo=algo),
         lambda dist, b, group=None: dist.broadcast(b.inp, _first(dist, group), group=group),
         lambda xs, r, w, b: xs[b.root], in_place=True),
    Case("reduce", lambda n, w: n, None,
         lambda comm, b, algo: comm.reduce(b.inp, b.root, b.redop, algo=algo),
         lambda dist, b, group=None: dist.reduce(b.inp, _first(dist, group), group=group),
         lambda xs, r, w, b: _red(xs, b) if r == b.root else xs[r], reduces=True,
         in_place=True),
    Case("all_to_all", lambda n, w: n, lambda n, w: n,
         lambda comm, b, algo: comm.all_to_all(b.inp, b.out, algo=algo),
         lambda dist, b, group=None: dist.all_to_all_single(b.out, b.inp, group=group),
         _a2a_expected),
    Case("all_to_all_v", lambda n, w: n, None, _a2av, _a2av_baseline, _a2av_expected),
    Case("send_recv", lambda n, w: n, lambda n, w: n,
         _sendrecv, _sendrecv_baseline,
         lambda xs, r, w, b: xs[(r - 1) % w]),
]}


def round_count(name: str, nbytes: int, itemsize: int, world: int) -> int:
    """Elements of the largest buffer for ``nbytes``, rounded so every rank gets whole rows."""
    n = max(1, nbytes // itemsize)
    if name in ("all_gather", "reduce_scatter", "all_to_all"):
        n = max(world, n // world * world)
    return n


# ---- the case table ---------------------------------------------------------------------------
@dataclass(frozen=True)
class BenchCase:
    """One row of the table: an operation with one algorithm, dtype, reduction, memory kind
    (``user``: ordinary tensors, staged; ``heap``: symmetric tensors, zero copy), size in
    bytes (of the largest buffer) and world size."""

    op: str
    algo: str
    dtype: str = "float32"
    nbytes: int = 8
    mem: str = "user"
    redop: str = "sum"
    world: int = 2
    #: which GPU kernel runs the row (gpu_check): ``fused`` (the hand-fused kernel, or whatever
    #: the setting picks: the bench's rows), ``plan`` (the generic plan kernel, fused kernels
    #: off), ``bits`` (random floats, fused and plan kernel compared bit for bit)
    engine: str = "fused"

    @property
    def id(self) -> str:
        red = f"/{self.redop}" if CASES[self.op].reduces else ""
        eng = "" if self.engine == "fused" else f"/{self.engine}"
        return (f"{self.op}/{self.algo}{red}/{self.dtype}/{self.mem}/{format_size(self.nbytes)}"
                f"/w{self.world}{eng}")

    @property
    def kernel(self) -> str:
        eng = "" if self.engine == "fused" else f"/{self.engine}"
        return f"{self.op}/{self.algo}{eng}"


def bench_table(op: str, algos: list[str], sizes: list[int], dtype: str = "float32",
                mem: str = "user", redop: str = "sum", world: int = 2) -> list[BenchCase]:
    """``tilecomm bench``'s rows: sizes x algorithms, in that order. Sizes that round to the
    same element count (tiny sizes below one element per rank) give one row, the first."""
    from ..types import DTYPE_BY_NAME

    itemsize = DTYPE_BY_NAME[dtype].itemsize if dtype in DTYPE_BY_NAME else 1
    seen, kept = set(), []
    for n in sizes:
        count = round_count(op, n, itemsize, world)
        if count not in seen:
            seen.add(count)
            kept.append(n)
    return [BenchCase(op, a, dtype, n, mem, redop, world) for n in kept for a in algos]


def _dtype_name(dt: torch.dtype) -> str:
    return str(dt).removeprefix("torch.")


def redop_applies(dt: str, red: str) -> bool:
    """The Communicator accepts this dtype with this reduction (avg needs a float dtype)."""
    from ..types import ReduceOp, lookup_dtype
    try:
        lookup_dtype(getattr(torch, dt), op=ReduceOp.parse(red), what="case table")
    except (TypeError, ValueError):
        return False
    return True


def kernel_table(kernels: dict, world: int, sizes: list[int], *, mems=("user", "heap"),
                 dtypes: list[str] | None = None, redops: list[str] | None = None,
                 full_sizes: list[int] | None = None, mix_mems: bool = False,
                 cover: bool = False, engine: str = "fused") -> list[BenchCase]:
    """Rows for every registered GPU kernel (``registry.KERNELS``: ``(op, algo) -> spec``),
    every dtype and reduction it registers (or those of ``dtypes``/``redops`` it registers)
    that the Communicator accepts, both memory kinds. float32 sum runs at every size of
    ``sizes`` in every memory kind; the other dtype/reduction pairs at ``full_sizes``
    (default: ``sizes``), in every memory kind, or (``mix_mems``) in one, alternating.
    ``cover``: instead of every dtype x reduction, every dtype with sum and every reduction
    with float32 and with bfloat16 (each registered dtype and op still runs). ``engine``: the
    rows' :attr:`BenchCase.engine` (``plan``: ``kernels`` are ``registry.plan_spec``'s)."""
    rows = []
    turn = 0
    for (op, algo), spec in sorted(kernels.items()):
        if op not in CASES:
            continue
        names = [_dtype_name(d) for d in spec.dtypes]
        if dtypes is not None:
            names = [n for n in names if n in dtypes]
        ops = list(spec.ops) if CASES[op].reduces else ["sum"]
        if redops is not None and CASES[op].reduces:
            ops = [o for o in ops if o in redops]
        for dt in names:
            for red in ops:
                if CASES[op].reduces and not redop_applies(dt, red):
                    continue
                if cover and red != "sum" and dt not in ("float32", "bfloat16"):
                    continue
                base = dt == "float32" and red == "sum"
                for n in (sizes if base else (full_sizes or sizes)):
                    use = mems
                    if mix_mems and not base:
                        use, turn = [mems[turn % len(mems)]], turn + 1
                    for mem in use:
                        rows.append(BenchCase(op, algo, dt, n, mem, red, world, engine))
    return rows


def random_data(seed: int, rank: int, count: int, dtype: torch.dtype) -> torch.Tensor:
    """Random floats of mixed magnitudes (``randn * 2**k``, k in -6..6), fresh per ``seed``:
    sums round, so the bits depend on the reduction order, the accumulation type and the
    division (gpu_check's bits check). Magnitudes stay far below float16's range."""
    g = torch.Generator().manual_seed(seed * 7919 + rank)
    x = torch.randn(count, generator=g)
    k = torch.randint(-6, 7, (count,), generator=g).to(torch.float32)
    return (x * torch.pow(2.0, k)).to(dtype)

"""One small hook set per benchmarked operation, nccl-tests style, over one shared harness.

``size`` is nccl-tests' size column: the bytes of the largest buffer of the call (the output of
all_gather, the input of reduce_scatter and all_to_all, the buffer of all_reduce, broadcast,
reduce, and the message of send_recv). Each case says how to make its buffers for a size, how to
run the operation with tilecomm and with a torch.distributed baseline, and what every rank must
hold afterwards (for ``--check``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch

from ..algorithms.collectives import BUSBW_FACTOR


def exact_data(seed: int, rank: int, count: int, dtype: torch.dtype) -> torch.Tensor:
    """Small integers: sums over any number of ranks in any order are exact (bitwise checks)."""
    g = torch.Generator().manual_seed(seed * 7919 + rank)
    return torch.randint(-3, 4, (count,), generator=g).to(dtype)


@dataclass
class Buffers:
    inp: torch.Tensor
    out: torch.Tensor | None = None


@dataclass(frozen=True)
class Case:
    name: str
    #: elements per rank of the input for a size (in elements of the largest buffer)
    in_count: Callable[[int, int], int]
    #: elements of the output (None: in place)
    out_count: Callable[[int, int], int] | None
    run: Callable            # (comm, bufs, algo) -> None
    baseline: Callable       # (dist, group, bufs) -> None  (torch.distributed)
    expected: Callable       # (inputs: list[Tensor], rank, world) -> Tensor
    reduces: bool = False

    def factor(self, world: int) -> float:
        return BUSBW_FACTOR[self.name](world)


def _sum(inputs):
    acc = inputs[0].clone()
    for x in inputs[1:]:
        acc += x
    return acc


def _a2a_expected(inputs, r, w):
    return torch.cat([x.chunk(w)[r] for x in inputs])


def uneven_rows(total: int, world: int, rank: int) -> list[int]:
    """Rows ``rank`` sends to each peer in the all_to_all_v benchmark: uneven (weights
    1..world rotating with the rank) and summing to ``total``."""
    weights = [1 + (rank + j) % world for j in range(world)]
    rows = [total * wt // sum(weights) for wt in weights]
    rows[-1] += total - sum(rows)
    return rows


def _a2av(comm, b, algo):
    w, r = comm.world_size, comm.rank
    n = b.inp.numel()
    send = uneven_rows(n, w, r)
    recv = [uneven_rows(n, w, j)[r] for j in range(w)]
    if b.out is None or b.out.numel() != sum(recv):
        b.out = torch.empty(sum(recv), dtype=b.inp.dtype)
    comm.all_to_all_v(b.inp, send, recv, out=b.out, algo=algo)


def _a2av_baseline(dist, b):
    w, r = dist.get_world_size(), dist.get_rank()
    n = b.inp.numel()
    send = uneven_rows(n, w, r)
    recv = [uneven_rows(n, w, j)[r] for j in range(w)]
    if b.out is None or b.out.numel() != sum(recv):
        b.out = torch.empty(sum(recv), dtype=b.inp.dtype)
    dist.all_to_all_single(b.out, b.inp, recv, send)


def _a2av_expected(inputs, r, w):
    parts = [torch.split(x, uneven_rows(x.numel(), w, j))[r] for j, x in enumerate(inputs)]
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


def _sendrecv_baseline(dist, b):
    w, r = dist.get_world_size(), dist.get_rank()
    if w == 1:
        b.out.copy_(b.inp)
        return
    reqs = [dist.isend(b.inp, (r + 1) % w), dist.irecv(b.out, (r - 1) % w)]
    for q in reqs:
        q.wait()


CASES: dict[str, Case] = {c.name: c for c in [
    Case("all_reduce", lambda n, w: n, None,
         lambda comm, b, algo: comm.all_reduce(b.inp, algo=algo),
         lambda dist, b: dist.all_reduce(b.inp),
         lambda xs, r, w: _sum(xs), reduces=True),
    Case("all_gather", lambda n, w: n // w, lambda n, w: n,
         lambda comm, b, algo: comm.all_gather(b.inp, b.out, algo=algo),
         lambda dist, b: dist.all_gather_into_tensor(b.out, b.inp),
         lambda xs, r, w: torch.cat(xs)),
    Case("reduce_scatter", lambda n, w: n, lambda n, w: n // w,
         lambda comm, b, algo: comm.reduce_scatter(b.inp, out=b.out, algo=algo),
         lambda dist, b: dist.reduce_scatter_tensor(b.out, b.inp),
         lambda xs, r, w: _sum(xs).chunk(w)[r], reduces=True),
    Case("broadcast", lambda n, w: n, None,
         lambda comm, b, algo: comm.broadcast(b.inp, 0, algo=algo),
         lambda dist, b: dist.broadcast(b.inp, 0),
         lambda xs, r, w: xs[0]),
    Case("reduce", lambda n, w: n, None,
         lambda comm, b, algo: comm.reduce(b.inp, 0, algo=algo),
         lambda dist, b: dist.reduce(b.inp, 0),
         lambda xs, r, w: _sum(xs) if r == 0 else xs[r], reduces=True),
    Case("all_to_all", lambda n, w: n, lambda n, w: n,
         lambda comm, b, algo: comm.all_to_all(b.inp, b.out, algo=algo),
         lambda dist, b: dist.all_to_all_single(b.out, b.inp),
         _a2a_expected),
    Case("all_to_all_v", lambda n, w: n, None, _a2av, _a2av_baseline, _a2av_expected),
    Case("send_recv", lambda n, w: n, lambda n, w: n,
         _sendrecv, _sendrecv_baseline,
         lambda xs, r, w: xs[(r - 1) % w]),
]}


def round_count(name: str, nbytes: int, itemsize: int, world: int) -> int:
    """Elements of the largest buffer for ``nbytes``, rounded so every rank gets whole rows."""
    n = max(1, nbytes // itemsize)
    if name in ("all_gather", "reduce_scatter", "all_to_all"):
        n = max(world, n // world * world)
    return n

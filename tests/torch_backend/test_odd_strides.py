"""The torch backend takes one-element tensors whose stride is not 1 (gap 6 of issue 12; the
Communicator side: tests/runtime/test_odd_strides.py)."""

from __future__ import annotations

import torch
import torch.distributed as dist

from .harness import run_ranks


def _odd(value: float) -> list[torch.Tensor]:
    """One-element tensors with strides 2, 5 and 4 (float64), holding ``value``."""
    ts = [torch.zeros(2)[::2], torch.zeros(1, 5)[:, 2],
          torch.zeros(3, 4, dtype=torch.float64)[1:2, 3]]
    for t in ts:
        assert t.is_contiguous() and t.stride(-1) != 1
        t.fill_(value)
    return ts


def _through_torch(rank, world):
    out = {}
    x = _odd(rank + 1)[0]
    dist.all_reduce(x)
    out["all_reduce"] = x.item()
    x = _odd(rank + 1)[1]
    dist.broadcast(x, src=1)
    out["broadcast"] = x.item()
    gathered = [torch.zeros(1) for _ in range(world)]
    dist.all_gather(gathered, _odd(rank + 1)[1])
    out["all_gather"] = [g.item() for g in gathered]
    big = torch.zeros(world)
    dist.all_gather_into_tensor(big, _odd(rank + 1)[0])
    out["all_gather_into_tensor"] = big.tolist()
    y = torch.zeros(3)[1:2]
    y.fill_(rank + 1)
    dist.reduce(y, dst=0)
    out["reduce"] = y.item()
    if rank == 0:
        dist.send(_odd(7)[2], 1)
    else:
        got = torch.zeros(1, 3, dtype=torch.float64)[:, 2]
        dist.recv(got, 0)
        out["recv"] = got.item()
    return out


def test_the_torch_backend_takes_them_too():
    results = run_ranks(_through_torch, 2)
    for r, out in enumerate(results):
        assert isinstance(out, dict), out
        assert out["all_reduce"] == 3.0
        assert out["broadcast"] == 2.0
        assert out["all_gather"] == [1.0, 2.0]
        assert out["all_gather_into_tensor"] == [1.0, 2.0]
        assert out["reduce"] == (3.0 if r == 0 else 2.0)
    assert results[1]["recv"] == 7.0

"""Tensors torch calls contiguous although their stride is not 1 (gap 6 of issue 12).

A tensor with at most one element is contiguous whatever its stride: ``torch.ones(2)[::2]``
(stride 2), ``torch.ones(1, 5)[:, 2]`` (stride 5), ``torch.ones(0, 3)[:, 1]``. Every collective,
and point-to-point must take them (Gloo does; the torch backend: tests/torch_backend/
test_odd_strides.py); they used to fail with
``RuntimeError: self.stride(-1) must be 1 to view Float as Byte``.
"""

from __future__ import annotations

import torch


def _odd(value: float) -> list[torch.Tensor]:
    """One-element tensors with strides 2, 5 and 4 (float64), holding ``value``."""
    ts = [torch.zeros(2)[::2], torch.zeros(1, 5)[:, 2],
          torch.zeros(3, 4, dtype=torch.float64)[1:2, 3]]
    for t in ts:
        assert t.is_contiguous() and t.stride(-1) != 1
        t.fill_(value)
    return ts


def _every_collective(comm):
    w, r = comm.world_size, comm.rank
    out = {}
    for i in range(3):
        x = _odd(r + 1)[i]
        comm.all_reduce(x)
        out[f"all_reduce{i}"] = x.item()
        out[f"all_gather{i}"] = comm.all_gather(_odd(r + 1)[i]).tolist()
        x = _odd(r + 1)[i]
        comm.broadcast(x, root=w - 1)
        out[f"broadcast{i}"] = x.item()
        x = _odd(r + 1)[i]
        comm.reduce(x, root=0)
        out[f"reduce{i}"] = x.item()
        out[f"all_to_all_v{i}"] = comm.all_to_all_v(_odd(r + 1)[i], [1] + [0] * (w - 1)).tolist()
        out[f"all_to_all{i}"] = comm.all_to_all(torch.full((w,), r + 1.0),
                                                out=torch.zeros(w, 2)[:, 0]).tolist()
    out["empty"] = tuple(comm.all_gather(torch.zeros(0, 3)[:, 1]).shape)
    x = torch.zeros(w, 3)[:, 1].fill_(r + 1)     # a strided input of reduce_scatter
    out["reduce_scatter"] = comm.reduce_scatter(x, out=torch.zeros(1, 2)[:, 1]).tolist()
    heap = comm.alloc(2)[::2]
    heap.fill_(r + 1)
    comm.all_reduce(heap)
    out["heap"] = heap.item()
    if r == 0:
        comm.send(_odd(6)[1], 1)
    elif r == 1:
        got = torch.zeros(4)[::4][:1]
        comm.recv(got, 0)
        out["recv"] = got.item()
    return out


def test_every_collective_takes_one_element_tensors_with_any_stride(rank_pool):
    w = 2
    total = float(sum(range(1, w + 1)))
    results = rank_pool(w).run(_every_collective)
    for r, out in enumerate(results):
        for i in range(3):
            assert out[f"all_reduce{i}"] == total
            assert out[f"all_gather{i}"] == [float(k + 1) for k in range(w)]
            assert out[f"broadcast{i}"] == w
            assert out[f"reduce{i}"] == (total if r == 0 else r + 1)
            assert out[f"all_to_all_v{i}"] == ([1.0, 2.0] if r == 0 else [])
            assert out[f"all_to_all{i}"] == [float(k + 1) for k in range(w)]
        assert out["empty"] == (0,)
        assert out["reduce_scatter"] == [total]
        assert out["heap"] == total
    assert results[1]["recv"] == 6.0

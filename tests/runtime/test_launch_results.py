"""tilecomm.launch returns what the ranks' function returns, tensors included.

The result used to travel through the Connection's ForkingPickler, which shares a tensor's
storage through shared memory that the parent maps only when it unpickles: the rank process
had exited by then and launch failed with "exited with code 0 before returning". Results now
travel by value (plain pickle).
"""

from __future__ import annotations

import pytest
import torch

import tilecomm


def _tensors(comm):
    r = comm.rank
    x = torch.arange(5, dtype=torch.float32) + 10 * r
    y = comm.all_reduce(torch.full((3,), float(r + 1)))
    heap = comm.alloc((2, 3), torch.int64)          # a tensor in the shared-memory heap
    heap.copy_(torch.arange(6).reshape(2, 3) * (r + 1))
    return {"plain": x, "reduced": y, "heap": heap,
            "nested": [x[1:3], (torch.ones(2, dtype=torch.bfloat16) * r, [torch.tensor(r)])],
            "scalar": r}


def _full(comm, k):
    return torch.full((4,), float(k + comm.rank))


def _unpicklable(comm):
    return lambda: comm.rank


@pytest.mark.parametrize("method", ["fork", "spawn"])
def test_tensors_nested_tensors_and_heap_tensors_come_back(method):
    res = tilecomm.launch(_tensors, 2, start_method=method, timeout=30)
    assert len(res) == 2
    for r, out in enumerate(res):
        assert torch.equal(out["plain"], torch.arange(5, dtype=torch.float32) + 10 * r)
        assert torch.equal(out["reduced"], torch.full((3,), 3.0))
        assert out["heap"].shape == (2, 3) and out["heap"].dtype == torch.int64
        assert torch.equal(out["heap"], torch.arange(6).reshape(2, 3) * (r + 1))
        a, (b, [c]) = out["nested"]
        assert torch.equal(a, torch.tensor([1.0, 2.0]) + 10 * r)
        assert b.dtype == torch.bfloat16 and torch.equal(b.float(), torch.full((2,), float(r)))
        assert int(c) == r and out["scalar"] == r
    # the results own their memory: the heap tensor is not a view of a removed segment
    res[0]["heap"].add_(1)
    assert int(res[0]["heap"][0, 0]) == 1


def test_a_result_that_cannot_be_pickled_is_reported():
    with pytest.raises(tilecomm.RankError, match="cannot be pickled"):
        tilecomm.launch(_unpicklable, 2, timeout=30)


def test_rank_group_runs_many_tasks_returning_tensors():
    with tilecomm.RankGroup(2, timeout=30) as g:
        for k in range(3):
            out = g.run(_full, k)
            assert [t.tolist() for t in out] == [[float(k)] * 4, [float(k + 1)] * 4]

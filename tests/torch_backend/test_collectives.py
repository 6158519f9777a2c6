"""The tilecomm torch.distributed backend gives the same results as Gloo, and exact ones.

Each rank runs a battery of torch.distributed calls with rank-dependent integer-valued data
(exact in any summation order); the results must equal Gloo's, and the values computed here.
"""

from __future__ import annotations

from functools import partial

import pytest
import torch
import torch.distributed as dist

from .harness import run_ranks


def _battery(rank: int, w: int, beyond_gloo: bool = True) -> dict:
    """Every collective torch.distributed exposes; ``beyond_gloo`` adds cases Gloo refuses."""
    out = {}
    f32 = lambda n, base: torch.arange(n, dtype=torch.float32) + base  # noqa: E731
    for dtype in (torch.float32, torch.float64, torch.int32, torch.int64, torch.bfloat16,
                  torch.float16, torch.int8, torch.uint8):
        t = (torch.arange(10) % 7 + rank).to(dtype)
        dist.all_reduce(t)
        out[f"all_reduce_sum_{dtype}"] = t.tolist()
    for op in ("PRODUCT", "MIN", "MAX"):
        t = torch.tensor([rank + 1, 5 - rank, 2], dtype=torch.int64)
        dist.all_reduce(t, op=getattr(dist.ReduceOp, op))
        out[f"all_reduce_{op}"] = t.tolist()
    for op in ("BAND", "BOR", "BXOR"):
        t = torch.tensor([rank + 1, 6, 12 >> rank], dtype=torch.uint8)
        dist.all_reduce(t, op=getattr(dist.ReduceOp, op))
        out[f"all_reduce_{op}"] = t.tolist()
    t = torch.tensor([1 + 2j * rank, 3 - 1j], dtype=torch.complex64)
    dist.all_reduce(t)
    out["all_reduce_complex"] = [(z.real, z.imag) for z in t.tolist()]
    t = torch.ones(5, 4)[:, 1] * (rank + 1)            # non-contiguous
    dist.all_reduce(t)
    out["all_reduce_strided"] = t.tolist()
    t = torch.tensor([rank % 2 == 0, True, False])
    dist.broadcast(t, src=w - 1)
    out["broadcast_bool"] = t.tolist()
    t = f32(5, 10 * rank)
    dist.broadcast(t, src=1)
    out["broadcast"] = t.tolist()
    t = f32(3, rank)
    dist.reduce(t, dst=w - 1, op=dist.ReduceOp.MAX)
    if rank == w - 1:
        out["reduce_max"] = t.tolist()
    parts = [torch.zeros(2, 2) for _ in range(w)]
    dist.all_gather(parts, torch.full((2, 2), float(rank)))
    out["all_gather"] = [p.tolist() for p in parts]
    o = torch.zeros(w * 3, dtype=torch.int32)
    dist.all_gather_into_tensor(o, torch.arange(3, dtype=torch.int32) * (rank + 1))
    out["all_gather_into_tensor"] = o.tolist()
    if beyond_gloo:
        o = torch.zeros(w * 3, dtype=torch.int16)
        dist.all_gather_into_tensor(o, torch.arange(3, dtype=torch.int16) * (rank + 1))
        out["all_gather_into_tensor_int16"] = o.tolist()
        t = torch.tensor([1.0, 2.0 * rank])
        dist.all_reduce(t, op=dist.ReduceOp.AVG)
        out["all_reduce_avg"] = t.tolist()
        outs = [torch.zeros(r + 1) for r in range(w)]    # uneven list all_to_all
        dist.all_to_all(outs, [torch.full((rank + 1,), float(10 * rank + j)) for j in range(w)])
        out["all_to_all_uneven"] = [x.tolist() for x in outs]
    o = torch.zeros(3)
    dist.reduce_scatter(o, [f32(3, 100 * j + rank) for j in range(w)])
    out["reduce_scatter"] = o.tolist()
    o = torch.zeros(2)
    dist.reduce_scatter_tensor(o, f32(2 * w, rank))
    out["reduce_scatter_tensor"] = o.tolist()
    o = torch.zeros(2 * w)
    dist.all_to_all_single(o, f32(2 * w, 100 * rank))
    out["all_to_all_single"] = o.tolist()
    # uneven splits: rank r sends j+1 rows to rank j, so it receives r+1 rows from everyone
    send = [j + 1 for j in range(w)]
    i = torch.cat([torch.full((j + 1, 2), float(10 * rank + j)) for j in range(w)])
    o = torch.zeros(w * (rank + 1), 2)
    dist.all_to_all_single(o, i, output_split_sizes=[rank + 1] * w, input_split_sizes=send)
    out["all_to_all_single_splits"] = o.tolist()
    outs = [torch.zeros(2) for _ in range(w)]
    dist.all_to_all(outs, [torch.full((2,), float(10 * rank + j)) for j in range(w)])
    out["all_to_all"] = [x.tolist() for x in outs]
    g = [torch.zeros(2) for _ in range(w)] if rank == 0 else None
    dist.gather(torch.full((2,), float(rank + 1)), g, dst=0)
    if rank == 0:
        out["gather"] = [x.tolist() for x in g]
    s = torch.zeros(2)
    dist.scatter(s, [torch.full((2,), float(j + 5)) for j in range(w)] if rank == 1 else None,
                 src=1)
    out["scatter"] = s.tolist()
    objs = [None] * w
    dist.all_gather_object(objs, {"rank": rank, "s": "x" * rank})
    out["all_gather_object"] = objs
    lst = [f"from {rank}", rank] if rank == 0 else [None, None]
    dist.broadcast_object_list(lst, src=0)
    out["broadcast_object_list"] = lst
    ts = [torch.ones(3) * rank, torch.ones(2)]
    with dist._coalescing_manager(async_ops=True) as cm:
        for t in ts:
            dist.all_reduce(t)
    cm.wait()
    out["all_reduce_coalesced"] = [t.tolist() for t in ts]
    # point-to-point in a ring, both directions posted before any wait
    r = torch.zeros(3)
    reqs = [dist.isend(torch.full((3,), float(rank)), (rank + 1) % w),
            dist.irecv(r, (rank - 1) % w)]
    for q in reqs:
        q.wait()
    out["isend_irecv_ring"] = r.tolist()
    ops = [dist.P2POp(dist.isend, torch.full((2,), float(rank)), (rank - 1) % w),
           dist.P2POp(dist.irecv, torch.zeros(2), (rank + 1) % w)]
    for q in dist.batch_isend_irecv(ops):
        q.wait()
    out["batch_isend_irecv"] = ops[1].tensor.tolist()
    sub = dist.new_group(list(range(0, w, 2)))
    if rank % 2 == 0:
        t = torch.full((2,), float(rank))
        dist.all_reduce(t, group=sub)
        out["new_group_even"] = t.tolist()
    work = dist.all_reduce(torch.ones(2) * rank, async_op=True)
    out["future"] = work.get_future().wait()[0].tolist()
    dist.barrier()
    return out


@pytest.mark.parametrize("world", [2, 3])
def test_same_results_as_gloo(world):
    ours = run_ranks(_battery, world, "tilecomm")
    gloo = run_ranks(partial(_battery, beyond_gloo=False), world, "gloo", timeout=60)
    for rank in range(world):
        assert isinstance(ours[rank], dict), ours[rank]
        assert isinstance(gloo[rank], dict), gloo[rank]
        assert len(gloo[rank]) > 30
        for key, theirs in gloo[rank].items():
            assert ours[rank][key] == theirs, (rank, key)


def test_exact_values_three_ranks():
    w = 3
    res = run_ranks(_battery, w)
    for r, out in enumerate(res):
        assert isinstance(out, dict), out
        base = [i % 7 for i in range(10)]
        assert out["all_reduce_sum_torch.float32"] == [w * b + 3 for b in base]
        assert out["all_reduce_sum_torch.int8"] == [w * b + 3 for b in base]
        assert out["all_reduce_PRODUCT"] == [6, 60, 8]
        assert out["all_reduce_BOR"] == [3, 6, 12 | 6 | 3]
        assert out["all_reduce_BXOR"] == [1 ^ 2 ^ 3, 6, 12 ^ 6 ^ 3]
        assert out["all_reduce_complex"] == [(3.0, 6.0), (9.0, -3.0)]
        assert out["all_reduce_strided"] == [6.0] * 5
        assert out["broadcast_bool"] == [True, True, False]       # rank 2 is even
        assert out["broadcast"] == [10.0, 11.0, 12.0, 13.0, 14.0]
        assert out["all_gather_into_tensor_int16"] == [0, 1, 2, 0, 2, 4, 0, 3, 6]
        assert out["all_reduce_avg"] == [1.0, 2.0]
        assert out["all_to_all_uneven"] == [[10.0 * j + r] * (j + 1) for j in range(w)]
        assert out["reduce_scatter"] == [3 * (100 * r) + 3 + k * 3 for k in range(3)]
        assert out["all_to_all_single_splits"] == [[10.0 * j + r] * 2 for j in range(w)
                                                   for _ in range(r + 1)]
        assert out["scatter"] == [float(r + 5)] * 2
        assert out["isend_irecv_ring"] == [float((r - 1) % w)] * 3
        assert out["batch_isend_irecv"] == [float((r + 1) % w)] * 2
        assert out["future"] == [3.0, 3.0]
        assert out["all_gather_object"] == [{"rank": j, "s": "x" * j} for j in range(w)]
    assert res[2]["reduce_max"] == [2.0, 3.0, 4.0]
    assert res[0]["gather"] == [[1.0, 1.0], [2.0, 2.0], [3.0, 3.0]]
    assert res[0]["new_group_even"] == [2.0, 2.0] and res[2]["new_group_even"] == [2.0, 2.0]


def _recv_any(rank: int, w: int):
    if rank == 0:
        got = []
        for _ in range(w - 1):
            t = torch.zeros(1)
            src = dist.recv(t)
            got.append((src, t.item()))
        return sorted(got)
    dist.send(torch.full((1,), float(10 * rank)), 0)
    return None


def test_recv_from_any_source():
    res = run_ranks(_recv_any, 3)
    assert res[0] == [(1, 10.0), (2, 20.0)]


def _sparse(rank: int, w: int):
    t = torch.sparse_coo_tensor([[rank, 3]], [float(rank + 1), 10.0], (5,))
    dist.all_reduce(t)
    return t.to_dense().tolist()


def test_sparse_all_reduce_sum_matches_gloo():
    ours = run_ranks(_sparse, 3)
    assert ours == run_ranks(_sparse, 3, "gloo", timeout=60)
    assert ours[0] == [1.0, 2.0, 3.0, 30.0, 0.0]

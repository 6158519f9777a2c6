"""Every collective and every registered algorithm against the reference, exactly.

Sizes include 1, odd sizes, sizes not divisible by the world size and sizes that run in several
pieces through the (deliberately small) scratch area of the test ranks.
"""

from __future__ import annotations

import pytest
import torch

from tilecomm import reference
from tilecomm.algorithms import algorithms

from .data import ALL_DTYPES, MOVE_DTYPES, make

WORLD_SIZES = [1, 2, 3, 4]
SIZES = [1, 7, 1000, 20_011]  # 20_011 float64 elements exceed the 64 KiB test scratch
REDUCE_OPS = ["sum", "prod", "min", "max", "avg"]


def _ops_for(dtype):
    return [op for op in REDUCE_OPS if op != "avg" or dtype.is_floating_point]


def _run_all_reduce(comm, algo, cases):
    outs = []
    for seed, n, dtype, op in cases:
        t = make(seed, comm.rank, (n,), dtype, op)
        assert comm.all_reduce(t, op, algo=algo) is t
        outs.append(t)
    return outs


@pytest.mark.parametrize("world_size", WORLD_SIZES)
@pytest.mark.parametrize("algo", algorithms("all_reduce") + ["auto"])
def test_all_reduce(rank_pool, world_size, algo):
    cases = [(i, n, d, op) for i, (n, d) in enumerate((n, d) for n in SIZES for d in ALL_DTYPES)
             for op in _ops_for(d) if n < 2000 or op == "sum"]
    results = rank_pool(world_size).run(_run_all_reduce, algo, cases)
    for c, (seed, n, dtype, op) in enumerate(cases):
        inputs = [make(seed, r, (n,), dtype, op) for r in range(world_size)]
        want = reference.all_reduce(inputs, op)
        for r in range(world_size):
            torch.testing.assert_close(results[r][c], want[r], rtol=0, atol=0,
                                       msg=lambda m: f"{algo} {dtype} n={n} op={op} rank {r}: {m}")


def _run_all_gather(comm, algo, cases):
    outs = []
    for seed, shape, dtype in cases:
        t = make(seed, comm.rank, shape, dtype)
        outs.append(comm.all_gather(t, algo=algo))
    return outs


@pytest.mark.parametrize("world_size", WORLD_SIZES)
@pytest.mark.parametrize("algo", algorithms("all_gather") + ["auto"])
def test_all_gather(rank_pool, world_size, algo):
    cases = [(i, shape, d) for i, (shape, d) in enumerate(
        (s, d) for s in [(1,), (7, 3), (1000,), (9001, 2)] for d in MOVE_DTYPES)]
    results = rank_pool(world_size).run(_run_all_gather, algo, cases)
    for c, (seed, shape, dtype) in enumerate(cases):
        want = reference.all_gather([make(seed, r, shape, dtype) for r in range(world_size)])
        for r in range(world_size):
            assert results[r][c].shape == (world_size * shape[0], *shape[1:])
            assert torch.equal(results[r][c], want[r]), f"{algo} {dtype} {shape} rank {r}"


def _run_reduce_scatter(comm, algo, cases):
    outs = []
    for seed, rows, dtype, op in cases:
        t = make(seed, comm.rank, (rows * comm.world_size, 3), dtype, op)
        before = t.clone()
        out = comm.reduce_scatter(t, op, algo=algo)
        assert torch.equal(t, before), "reduce_scatter modified its input"
        outs.append(out)
    return outs


@pytest.mark.parametrize("world_size", WORLD_SIZES)
@pytest.mark.parametrize("algo", algorithms("reduce_scatter") + ["auto"])
def test_reduce_scatter(rank_pool, world_size, algo):
    cases = [(i, rows, d, op) for i, (rows, d) in enumerate(
        (rows, d) for rows in [1, 5, 3001] for d in ALL_DTYPES) for op in _ops_for(d)
        if rows < 3000 or op == "sum"]
    results = rank_pool(world_size).run(_run_reduce_scatter, algo, cases)
    for c, (seed, rows, dtype, op) in enumerate(cases):
        inputs = [make(seed, r, (rows * world_size, 3), dtype, op) for r in range(world_size)]
        want = reference.reduce_scatter(inputs, op)
        for r in range(world_size):
            torch.testing.assert_close(results[r][c], want[r], rtol=0, atol=0)


def _run_rooted(comm, name, algo, cases):
    outs = []
    for seed, n, dtype, root, op in cases:
        t = make(seed, comm.rank, (n,), dtype, op or "sum")
        if name == "broadcast":
            assert comm.broadcast(t, root, algo=algo) is t
        else:
            assert comm.reduce(t, root, op, algo=algo) is t
        outs.append(t)
    return outs


@pytest.mark.parametrize("world_size", WORLD_SIZES)
@pytest.mark.parametrize("name,algo", [("broadcast", a) for a in algorithms("broadcast")]
                         + [("reduce", a) for a in algorithms("reduce")]
                         + [("broadcast", "auto"), ("reduce", "auto")])
def test_rooted(rank_pool, world_size, name, algo):
    dtypes = MOVE_DTYPES if name == "broadcast" else ALL_DTYPES
    cases = []
    for i, (n, d) in enumerate((n, d) for n in [1, 33, 20_011] for d in dtypes):
        for root in range(world_size):
            for op in ([None] if name == "broadcast" else _ops_for(d)):
                if n > 2000 and op not in (None, "sum"):
                    continue
                cases.append((i, n, d, root, op))
    results = rank_pool(world_size).run(_run_rooted, name, algo, cases)
    for c, (seed, n, dtype, root, op) in enumerate(cases):
        inputs = [make(seed, r, (n,), dtype, op or "sum") for r in range(world_size)]
        want = (reference.broadcast(inputs, root) if name == "broadcast"
                else reference.reduce(inputs, root, op))
        for r in range(world_size):
            torch.testing.assert_close(results[r][c], want[r], rtol=0, atol=0,
                                       msg=lambda m: f"{name}/{algo} root={root} rank {r}: {m}")


def _run_all_to_all(comm, algo, cases):
    outs = []
    for seed, rows, dtype in cases:
        t = make(seed, comm.rank, (rows * comm.world_size, 2), dtype)
        outs.append(comm.all_to_all(t, algo=algo))
    return outs


@pytest.mark.parametrize("world_size", WORLD_SIZES)
@pytest.mark.parametrize("algo", algorithms("all_to_all") + ["auto"])
def test_all_to_all(rank_pool, world_size, algo):
    cases = [(i, rows, d) for i, (rows, d) in enumerate(
        (rows, d) for rows in [1, 7, 5003] for d in MOVE_DTYPES)]
    results = rank_pool(world_size).run(_run_all_to_all, algo, cases)
    for c, (seed, rows, dtype) in enumerate(cases):
        want = reference.all_to_all([make(seed, r, (rows * world_size, 2), dtype)
                                     for r in range(world_size)])
        for r in range(world_size):
            assert torch.equal(results[r][c], want[r]), f"{algo} {dtype} rows={rows} rank {r}"


def _counts(seed, w):
    g = torch.Generator().manual_seed(seed)
    m = torch.randint(0, 6, (w, w), generator=g)
    if seed % 3 == 0:
        m[:, 0] = 0          # a rank that receives nothing
    if seed % 5 == 1:
        m[0, :] = 4000       # a large sender: several pieces
    return m.tolist()


def _run_all_to_all_v(comm, algo, cases, give_recv):
    outs = []
    for seed, dtype in cases:
        m = _counts(seed, comm.world_size)
        send = m[comm.rank]
        t = make(seed, comm.rank, (sum(send), 3), dtype)
        recv = [m[j][comm.rank] for j in range(comm.world_size)] if give_recv else None
        outs.append(comm.all_to_all_v(t, send, recv, algo=algo))
    return outs


@pytest.mark.parametrize("world_size", WORLD_SIZES)
@pytest.mark.parametrize("algo", algorithms("all_to_all_v") + ["auto"])
@pytest.mark.parametrize("give_recv", [False, True])
def test_all_to_all_v(rank_pool, world_size, algo, give_recv):
    cases = [(seed, d) for seed in range(6) for d in (torch.float32, torch.bfloat16, torch.int8)]
    results = rank_pool(world_size).run(_run_all_to_all_v, algo, cases, give_recv)
    for c, (seed, dtype) in enumerate(cases):
        m = _counts(seed, world_size)
        inputs = [make(seed, r, (sum(m[r]), 3), dtype) for r in range(world_size)]
        want = reference.all_to_all_v(inputs, m)
        for r in range(world_size):
            assert torch.equal(results[r][c], want[r]), f"{algo} seed={seed} rank {r}"


def _run_heap(comm, n):
    """Symmetric-heap tensors: zero-copy paths, peer views, and the same results."""
    out = {}
    t = comm.alloc((n,), torch.float32)
    t.copy_(make(1, comm.rank, (n,), torch.float32))
    comm.barrier()
    out["peer"] = comm.peer(t, (comm.rank + 1) % comm.world_size).clone()
    comm.barrier()
    for algo in ("one_shot", "two_shot", "ring", "recursive_doubling", "rhd"):
        t.copy_(make(1, comm.rank, (n,), torch.float32))
        comm.all_reduce(t, algo=algo)
        out[algo] = t.clone()
    x = comm.alloc((n, 2), torch.bfloat16)
    x.copy_(make(2, comm.rank, (n, 2), torch.bfloat16))
    out["ag"] = comm.all_gather(x, algo="ring")
    del x, t
    return out


@pytest.mark.parametrize("world_size", [2, 3])
@pytest.mark.parametrize("n", [5, 30_000])
def test_symmetric_heap_tensors(rank_pool, world_size, n):
    results = rank_pool(world_size).run(_run_heap, n)
    inputs = [make(1, r, (n,), torch.float32) for r in range(world_size)]
    want = reference.reduced(inputs)
    for r in range(world_size):
        assert torch.equal(results[r]["peer"], inputs[(r + 1) % world_size])
        for algo in ("one_shot", "two_shot", "ring", "recursive_doubling", "rhd"):
            assert torch.equal(results[r][algo], want), algo
        want_ag = reference.all_gather([make(2, j, (n, 2), torch.bfloat16)
                                        for j in range(world_size)])[r]
        assert torch.equal(results[r]["ag"], want_ag)


def _run_noncontig(comm):
    base = make(3, comm.rank, (6, 8), torch.float32)
    comm.all_reduce(base.t())                  # in place through a non-contiguous view
    g = comm.all_gather(make(4, comm.rank, (6, 8), torch.float32)[:, ::2])
    out = torch.zeros(8, 6).t()                # non-contiguous output
    comm.reduce_scatter(make(5, comm.rank, (6 * comm.world_size, 8), torch.float32), out=out)
    return base, g, out


def test_non_contiguous(rank_pool):
    w = 2
    results = rank_pool(w).run(_run_noncontig)
    inputs = [make(3, r, (6, 8), torch.float32) for r in range(w)]
    want = reference.reduced(inputs)
    ag = reference.all_gather([make(4, r, (6, 8), torch.float32)[:, ::2] for r in range(w)])
    rs = reference.reduce_scatter([make(5, r, (12, 8), torch.float32) for r in range(w)])
    for r in range(w):
        base, g, out = results[r]
        assert torch.equal(base, want)
        assert torch.equal(g, ag[r])
        assert torch.equal(out, rs[r])


def _run_send_recv(comm, sizes):
    got = []
    for n in sizes:
        if comm.rank == 0:
            for peer in range(1, comm.world_size):
                comm.send(make(n, peer, (n,), torch.float64), peer)
        else:
            t = torch.empty(n, dtype=torch.float64)
            got.append(comm.recv(t, 0))
    # ring exchange: even ranks send first, odd ranks receive first (no deadlock)
    nxt, prv = (comm.rank + 1) % comm.world_size, (comm.rank - 1) % comm.world_size
    x = torch.full((5,), float(comm.rank))
    y = torch.empty(5)
    if comm.world_size > 1:
        if comm.rank % 2 == 0:
            comm.send(x, nxt)
            comm.recv(y, prv)
        else:
            comm.recv(y, prv)
            comm.send(x, nxt)
    return got, y


@pytest.mark.parametrize("world_size", [2, 4])
def test_send_recv(rank_pool, world_size):
    sizes = [1, 1000, 1_000_003]   # the last one is larger than a mailbox: several pieces
    results = rank_pool(world_size).run(_run_send_recv, sizes)
    for r in range(1, world_size):
        got, y = results[r]
        for t, n in zip(got, sizes):
            assert torch.equal(t, make(n, r, (n,), torch.float64))
    for r in range(world_size):
        assert torch.equal(results[r][1], torch.full((5,), float((r - 1) % world_size)))


def _run_barrier(comm):
    import time
    if comm.rank == 0:
        time.sleep(0.3)
    t0 = time.monotonic()
    comm.barrier()
    return time.monotonic() - t0


def test_barrier_waits_for_slowest(rank_pool):
    waited = rank_pool(3).run(_run_barrier)
    assert all(w > 0.15 for w in waited[1:]), waited


def _run_repeated(comm):
    """Cached plans and memoized calls must follow the tensor's current contents, and a
    strided view sharing the pointer of a memoized tensor must not reuse its plan."""
    outs = []
    t = torch.empty(300)
    for i in range(6):
        t.copy_(make(10 + i, comm.rank, (300,), torch.float32))
        comm.all_reduce(t, algo="one_shot" if i % 2 else "auto")
        outs.append(t.clone())
    big = make(20, comm.rank, (8, 8), torch.float32)
    comm.all_reduce(big.view(-1)[:8])      # contiguous: first row, memoized
    comm.all_reduce(big[:, 0])             # same data pointer and numel, strided: column 0
    outs.append(big)
    return outs


def test_repeated_calls_and_aliasing_views(rank_pool):
    w = 3
    res = rank_pool(w).run(_run_repeated)
    for i in range(6):
        want = reference.reduced([make(10 + i, r, (300,), torch.float32) for r in range(w)])
        for r in range(w):
            assert torch.equal(res[r][i], want)
    ins = [make(20, r, (8, 8), torch.float32) for r in range(w)]
    row0 = reference.reduced([x[0] for x in ins])
    for r in range(w):
        got = res[r][-1]
        assert torch.equal(got[0, 1:], row0[1:])                  # first call: row 0
        assert got[0, 0] == w * row0[0]                           # both calls touched [0, 0]
        assert torch.equal(got[1:, 0], reference.reduced([x[1:, 0] for x in ins]))  # column
        assert torch.equal(got[1:, 1:], ins[r][1:, 1:])           # untouched


def _run_repeated_pairs(comm):
    """NOTE [pair memo]: all_gather, reduce_scatter and all_to_all with the same input and
    given output again must follow the input's contents, a changed op, views of the same
    memory with other shapes, an output moved to other memory, and must not keep a staged
    (strided) tensor or a dead one."""
    import gc
    w, r = comm.world_size, comm.rank
    x = torch.empty(6, 4)
    out = torch.empty(6 * w, 4)
    got = {}
    for i in range(3):
        x.copy_(make(30 + i, r, (6, 4), torch.float32))
        got[f"ag{i}"] = comm.all_gather(x, out=out).clone()
    got["kept"] = comm._calls.pair[0] is not None
    # the same objects and pointers, fewer rows
    x.resize_(3, 4)
    out.resize_(3 * w, 4)
    got["ag_view"] = comm.all_gather(x, out=out).clone()
    x.resize_(6, 4)
    out.resize_(6 * w, 4)
    other = torch.empty(6 * w, 4)
    out.set_(other)                                       # same object, other memory
    got["ag_moved"] = comm.all_gather(x, out=out).clone()
    got["moved_ok"] = torch.equal(other, got["ag_moved"])
    rs_in = make(40, r, (4 * w, 3), torch.float32)
    rs_out = torch.empty(4, 3)
    for k, op in enumerate(("sum", "sum", "max", "max", "sum")):
        got[f"rs{k}"] = comm.reduce_scatter(rs_in, op, out=rs_out).clone()
    a_in = make(50, r, (2 * w, 5), torch.float32)
    a_out = torch.empty(2 * w, 5)
    for k in range(2):
        got[f"a2a{k}"] = comm.all_to_all(a_in, out=a_out).clone()
    strided = make(60, r, (6, 8), torch.float32)[:, ::2]   # staged: not kept
    got["ag_strided"] = comm.all_gather(strided, out=out).clone()
    last = comm._calls.pair[0]
    got["strided_kept"] = last is not None and last[0]() is strided
    comm.all_to_all(a_in, out=a_out)
    del a_in
    gc.collect()
    got["dropped"] = comm._calls.pair[0] is None
    return got


def test_repeated_two_buffer_calls_follow_their_tensors(rank_pool):
    w = 2
    res = rank_pool(w).run(_run_repeated_pairs)
    for me, got in enumerate(res):
        assert got["kept"] and not got["strided_kept"] and got["dropped"] and got["moved_ok"]
        for i in range(3):
            want = torch.cat([make(30 + i, q, (6, 4), torch.float32) for q in range(w)])
            assert torch.equal(got[f"ag{i}"], want)
        assert torch.equal(got["ag_view"], torch.cat([make(32, q, (6, 4), torch.float32)[:3]
                                                      for q in range(w)]))
        assert torch.equal(got["ag_moved"], want)
        ins = [make(40, q, (4 * w, 3), torch.float32) for q in range(w)]
        for k, op in enumerate(("sum", "sum", "max", "max", "sum")):
            full = reference.reduced(ins) if op == "sum" else torch.stack(ins).amax(0)
            assert torch.equal(got[f"rs{k}"], full[4 * me:4 * me + 4]), op
        blocks = [make(50, q, (2 * w, 5), torch.float32)[2 * me:2 * me + 2] for q in range(w)]
        assert torch.equal(got["a2a0"], torch.cat(blocks))
        assert torch.equal(got["a2a1"], torch.cat(blocks))
        assert torch.equal(got["ag_strided"],
                           torch.cat([make(60, q, (6, 8), torch.float32)[:, ::2]
                                      for q in range(w)]))


def _run_a2av_out(comm):
    w, r = comm.world_size, comm.rank
    m = _counts(7, w)
    t = make(7, r, (sum(m[r]), 3), torch.float32)
    recv = [m[j][r] for j in range(w)]
    out = torch.full((sum(recv), 3), -1.0)
    got = comm.all_to_all_v(t, m[r], recv, out=out)
    return got is out, out


def test_all_to_all_v_into_out(rank_pool):
    w = 3
    res = rank_pool(w).run(_run_a2av_out)
    m = _counts(7, w)
    want = reference.all_to_all_v([make(7, r, (sum(m[r]), 3), torch.float32) for r in range(w)], m)
    for r in range(w):
        assert res[r][0] and torch.equal(res[r][1], want[r])


def _exchanges(comm):
    """Repeated exchanges of one length (they reuse buffers) and of another length."""
    got = [comm.exchange([comm.rank * 100 + i, -i, 2**62 + comm.rank]) for i in range(5)]
    got.append(comm.exchange([comm.rank]))
    got.append(comm.exchange([7 * comm.rank, 1, 2]))
    return got


def test_exchange_returns_every_calls_own_values(rank_pool):
    results = rank_pool(3).run(_exchanges)
    for got in results:
        for i in range(5):
            assert got[i] == [[r * 100 + i, -i, 2**62 + r] for r in range(3)]
        assert got[5] == [[0], [1], [2]]
        assert got[6] == [[0, 1, 2], [7, 1, 2], [14, 1, 2]]


def _host_comm_is_self(comm):
    return comm.host_comm is comm


def test_host_comm_of_one_host_is_the_communicator(rank_pool):
    assert rank_pool(2).run(_host_comm_is_self) == [True, True]


def _heap_blocks_follow_alloc_and_free(comm):
    before = comm.heap_blocks()
    a, b = comm.alloc(100), comm.alloc(3, torch.float64)
    held = comm.heap_blocks()
    del a
    after_one = comm.heap_blocks()
    del b
    return before, held, after_one, comm.heap_blocks()


def test_heap_blocks_list_the_live_allocations_the_same_on_every_rank(rank_pool):
    res = rank_pool(2).run(_heap_blocks_follow_alloc_and_free)
    assert res[0] == res[1]
    before, held, after_one, after = res[0]
    new = sorted(set(held) - set(before))
    assert len(new) == 2 and new[0][1] >= 400 and new[1][1] >= 24, new
    assert len(after_one) == len(before) + 1 and after == before

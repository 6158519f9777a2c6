"""Single-copy reads (PLACE_CMA: peers read a rank's own tensor with process_vm_readv instead
of it staging the tensor into shared memory) against staging.

Reading in place moves the same values through the same plan, so every collective and
algorithm must give the staged bits on random floats, on either engine and with the engines
mixed across ranks; the ranks agree on whether to read in place (one rank that cannot makes
every rank stage); and a read that fails raises on the reader naming the peer, and on the
peer too, instead of hanging or returning wrong data.
"""

from __future__ import annotations

import pytest
import torch

import tilecomm
from tilecomm import CommError
from tilecomm.algorithms import algorithms
from tilecomm.backends.cpu import cma, native
from tilecomm.backends.cpu.plan import PLACE_CMA
from tilecomm.heap.base import SegmentLayout

from .data import random_values as _random

pytestmark = pytest.mark.skipif(not cma.supported(), reason="no process_vm_readv here")

COLLECTIVES = ["all_reduce", "reduce_scatter", "all_gather", "broadcast", "reduce", "all_to_all",
               "all_to_all_v"]


def _call(comm, coll, algo, t, op):
    if coll == "all_reduce":
        return comm.all_reduce(t, op, algo=algo)
    if coll == "reduce_scatter":
        return comm.reduce_scatter(t, op, algo=algo)
    if coll == "all_gather":
        return comm.all_gather(t, algo=algo)
    if coll == "broadcast":
        return comm.broadcast(t, root=comm.world_size - 1, algo=algo)
    if coll == "reduce":
        return comm.reduce(t, root=1, op=op, algo=algo)
    if coll == "all_to_all_v":      # uneven rows of 7 elements: rank r sends r + j + 1 to j
        w = comm.world_size
        rows = t[:t.numel() // 7 * 7].view(-1, 7)
        counts = [(comm.rank + j + 1) * rows.shape[0] // (3 * w * w) for j in range(w)]
        return comm.all_to_all_v(rows[:sum(counts)], counts, algo=algo)
    return comm.all_to_all(t, algo=algo)


def _can_read_peers(comm) -> bool:
    """Whether this rank can read every peer (the start-up probe's check, made here: with more
    ranks than CPUs the runtime does not use single-copy reads, and the tests force them)."""
    comm.barrier()
    ch = comm._backend.executor.ch
    for r in range(comm.world_size):
        pid = int(ch.slots[r][SegmentLayout.PID])
        addr = int(ch.slots[r][SegmentLayout.SELF_ADDR]) + 8 * SegmentLayout.PID
        if r != comm.rank and not cma.probe(pid, addr, pid.to_bytes(8, "little", signed=True)):
            return False
    return True


def _collectives(comm, cases, mode):
    """Every case, three times (a template's first run is Python, the next ones native);
    ``mode``: "stage" (no single copy), or "python", "native", "mixed" (rank 0 native) with
    every buffer read in place."""
    ex = comm._backend.executor
    saved = ex.native, ex.cma, ex.cma_min_bytes, comm.deterministic
    comm.deterministic = False          # a pooled rank: every algorithm
    ex.native = mode == "native" or (mode == "mixed" and comm.rank == 0)
    ex.cma = mode != "stage"        # forced: the caller checked every rank can (_can_read_peers)
    ex.cma_min_bytes = 1
    outs, in_place = [], 0
    try:
        for coll, algo, n, dtype, op, seed in cases:
            for _ in range(3):
                out = _call(comm, coll, algo, _random(seed * 31 + comm.rank, n, dtype), op)
            outs.append(out.view(torch.uint8).clone())
        in_place = sum(PLACE_CMA in t.places for t in ex._templates.values())
    finally:
        ex.native, ex.cma, ex.cma_min_bytes, comm.deterministic = saved
        ex._templates.clear()       # pooled ranks: later tests build their own templates
        ex._ready.clear()
    return outs, in_place


def _cases(world: int):
    cases = []
    for coll in COLLECTIVES:
        for algo in algorithms(coll):
            # 300k float32 runs in pieces of the test scratch: remote reads at piece offsets
            for i, n in enumerate([3000, 300_000]):
                n -= n % world
                for dtype in [torch.float32, torch.bfloat16] if i == 0 else [torch.float32]:
                    op = "avg" if (i == 0 and coll in ("all_reduce", "reduce_scatter")) else "sum"
                    cases.append((coll, algo, n, dtype, op, len(cases)))
    return cases


@pytest.mark.slow
@pytest.mark.parametrize("world_size", [2, 3])
def test_reading_in_place_gives_the_staged_bits(rank_pool, world_size):
    group = rank_pool(world_size)
    if not all(group.run(_can_read_peers)):
        pytest.skip("process_vm_readv between ranks is not allowed here (see doctor)")
    cases = _cases(world_size)
    staged = group.run(_collectives, cases, "stage")
    assert all(used == 0 for _, used in staged)
    for mode in ("python", "native", "mixed"):
        got = group.run(_collectives, cases, mode)
        for r in range(world_size):
            assert got[r][1] > 0, f"{mode}: no buffer was read in place"
            for c, case in enumerate(cases):
                assert torch.equal(got[r][0][c], staged[r][0][c]), f"{mode}, rank {r}: {case}"


def _one_rank_cannot(comm):
    """all_gather reads in place while every rank can; then rank 1 says it cannot read its
    peers, and every rank stages."""
    ex = comm._backend.executor
    if not _can_read_peers(comm):
        return "skip"
    ex.cma_min_bytes = 1
    x = _random(comm.rank, 5000, torch.float32)
    out = []
    for cannot in (False, True):
        if cannot:
            if comm.rank == 1:
                ex.ch.me[SegmentLayout.CMA] = 2
            comm.barrier()
            ex.cma = None
            ex._templates.clear()
            ex._ready.clear()
        y = comm.all_gather(x)
        out.append((ex.cma, any(PLACE_CMA in t.places for t in ex._templates.values()), y))
    return out


def test_one_rank_that_cannot_read_makes_every_rank_stage():
    out = tilecomm.launch(_one_rank_cannot, 2)
    if out[0] == "skip":
        pytest.skip("process_vm_readv between ranks is not allowed here")
    want = torch.cat([_random(0, 5000, torch.float32), _random(1, 5000, torch.float32)])
    for (can, used, y), (cannot, used_after, y_after) in out:
        assert can is True and used is True
        assert cannot is False and used_after is False
        assert torch.equal(y, want) and torch.equal(y_after, want)


def _bad_address(comm, reader_native: bool):
    """Rank 1 announces an address that is not mapped in its process; rank 0 reads it."""
    ex = comm._backend.executor
    if not _can_read_peers(comm):
        return "skip"
    ex.cma_min_bytes = 1
    ex.native = reader_native and comm.rank == 0 and native.enabled(comm.world_size)
    x = torch.ones(4096)
    for _ in range(3):
        comm.all_gather(x)          # rank 0's native program is built by now
    if comm.rank == 1:
        def post(seq, prog, places, buffers):
            base = ex.ch.desc_base(seq) + native.D_ADDR
            for i, p in enumerate(places):
                if p == PLACE_CMA:
                    ex.ch.me[base + i] = 4096        # the unmapped first page
        ex._post_addresses = post
    try:
        comm.all_gather(x)
    except CommError as e:
        err = e
    else:
        return None
    try:
        comm.barrier()
    except CommError as e:
        after = str(e)
    else:
        after = None
    return type(err).__name__, str(err), after


@pytest.mark.parametrize("reader", ["native", "python"])
def test_a_failed_read_raises_on_every_rank_naming_the_peer(reader):
    if reader == "native" and not native.enabled(2):
        pytest.skip("the native runner was not built")
    out = tilecomm.launch(_bad_address, 2, reader == "native", timeout=20)
    if out[0] == "skip":
        pytest.skip("process_vm_readv between ranks is not allowed here")
    kind, msg, after = out[0]
    assert kind == "PeerReadError", msg
    assert "all_gather #" in msg and "on rank 0" in msg and "rank 1's buffer" in msg, msg
    assert "Bad address" in msg, msg
    assert after is not None and "unusable" in after, after    # the communicator is broken
    kind1, msg1, _ = out[1]
    # told (or, if rank 0 has returned already, seeing it exit), not left to the timeout
    assert "rank 0 gave up" in msg1 or "rank(s) [0] exited" in msg1, msg1


def test_fold_copies_never_writes_a_buffer_peers_read_in_place_early():
    from tilecomm.backends.cpu.plan import Op, Operand
    mine = Operand(None, "buf", 0, 32)
    tmp = Operand(0, "tmp", 1000, 0)
    reduce_ = Op(tmp, (mine, Operand(1, "tmp", 1000, 0)), False, 8)
    copy_back = Op(mine, (tmp,), False, 8)
    assert native.fold_copies([[reduce_], [copy_back]], {"buf"}) == [[reduce_], [copy_back]]
    assert native.fold_copies([[reduce_], [copy_back]]) == [[native.Folded(reduce_, mine)], []]


def _a2av_output_crosses_threshold(comm):
    """all_to_all_v allocates its output after the handshake: the bytes it adds must not
    change where the input was announced to be (the threshold lies between)."""
    ex = comm._backend.executor
    rows = _random(comm.rank, 600 * 7, torch.float32).view(600, 7)
    counts = [100 + 50 * comm.rank + 30 * j for j in range(comm.world_size)]
    ex.cma_min_bytes = rows[:sum(counts)].nbytes + 1
    outs = [comm.all_to_all_v(rows[:sum(counts)], counts) for _ in range(3)]
    return rows, counts, outs


def test_all_to_all_v_keeps_the_places_it_announced():
    out = tilecomm.launch(_a2av_output_crosses_threshold, 2)
    for me, (_, _, outs) in enumerate(out):
        want = []
        for rows, counts, _ in out:
            start = sum(counts[:me])
            want.append(rows[start:start + counts[me]])
        for got in outs:
            assert torch.equal(got, torch.cat(want))


def _decision(comm):
    # Every rank publishes its single-copy state just after init's rendezvous; a first call
    # that finds a peer's state not yet there stages and decides later (correct, but not what
    # this test looks at): past the barrier, every peer has published.
    comm.barrier()
    x = _random(comm.rank, 50_000, torch.float32)
    y = comm.all_gather(x)
    ex = comm._backend.executor
    return (int(ex.ch.me[SegmentLayout.CMA]), ex.cma,
            any(PLACE_CMA in t.places for t in ex._templates.values()), y)


def test_more_ranks_than_cpus_stage(monkeypatch):
    """Oversubscribed (here: 2 ranks told they have one CPU), several readers of one buffer
    were slower than staging: every rank says so at start and stages."""
    import os
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0})
    out = tilecomm.launch(_decision, 2)
    want = torch.cat([_random(r, 50_000, torch.float32) for r in range(2)])
    for state, flag, used, y in out:
        assert state == cma.SINGLE_COPY_OVERSUBSCRIBED and flag is False and not used
        assert torch.equal(y, want)

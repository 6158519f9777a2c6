"""Keep going when ranks fail: abort, revoke, shrink and grow on one host (tilecomm.elastic;
the stop word, NOTE [stop word] in backends/cpu/channel.py)."""

from __future__ import annotations

import os
import re
import signal
import threading
import time
from datetime import timedelta

import pytest
import torch
import torch.distributed as dist

import tilecomm
from tilecomm import CommAborted, CommMismatch, CommTimeout
from tilecomm.soak import soak_rank


def _stopped_by_a_watchdog(comm, how):
    """Rank 1 stays out of the second all_reduce; a watchdog thread of rank 0 stops the
    communicator while ranks 0 and 2 wait in it. Then the three shrink past nobody."""
    t = torch.ones(64)
    comm.all_reduce(t)
    if comm.rank == 1:
        time.sleep(0.6)         # arrives after the stop: its call must fail too
    if comm.rank == 0:
        threading.Timer(0.2, getattr(comm, how), args=("the watchdog saw no progress",)).start()
    t0 = time.monotonic()
    try:
        comm.all_reduce(t)
        cut = ("completed", "", -1, 0.0)
    except CommAborted as e:
        cut = (type(e).__name__, str(e), e.by, time.monotonic() - t0)
    try:
        comm.alloc(8)
        later = "alloc completed"
    except CommAborted as e:
        later = type(e).__name__
    new = comm.shrink([])
    x = torch.full((1000,), float(new.rank + 1))
    new.all_reduce(x)
    events = [(r.op, r.note) for r in comm.flight.records if r.op in ("abort", "revoke",
                                                                      "shrink")]
    comm.close()
    new.close()
    return cut, later, x[0].item(), events


@pytest.mark.parametrize("how, error", [("abort", "CommAborted"), ("revoke", "CommRevoked")])
def test_a_stop_from_another_thread_ends_every_ranks_call(rank_pool, how, error):
    out = rank_pool(3).run_and_discard(_stopped_by_a_watchdog, how)
    for rank, (cut, later, total, events) in enumerate(out):
        kind, text, by, waited = cut
        assert kind == error, (rank, cut)
        verb = "aborted" if how == "abort" else "revoked"
        # sequence numbers go on from the calls other tests made on these ranks
        assert re.search(rf"all_reduce #\d+ on rank {rank}: the communicator was {verb} by "
                         rf"rank 0 \(its last call was #\d+\)", text), text
        assert "the watchdog saw no progress" in text and by == 0
        # ended by the stop word (checked every 0.2 s), not by the 20 s timeout
        assert waited < 5, cut
        assert later == error                  # every later call is refused at once
        assert total == 6.0                    # the shrunk communicator works
        assert ("shrink", "excluded []; 3 ranks, this one now rank %d" % rank) in events
    assert (how, "rank 0: the watchdog saw no progress") in out[0][3]


def _disagree_then_leave_one_out(comm):
    """Rank 0 excludes rank 2, ranks 1 and 2 exclude nobody: all three raise CommMismatch.
    Then ranks 0 and 1 shrink past rank 2, which is alive and simply closes."""
    mine = [2] if comm.rank == 0 else []
    try:
        comm.shrink(mine, timeout=5)
        first = "agreed"
    except CommMismatch as e:
        first = str(e)
    if comm.rank == 2:
        comm.close()
        return first, None
    new = comm.shrink([2])
    got = new.all_gather(torch.tensor([comm.rank]))
    new.close()
    comm.close()
    return first, got.tolist()


def test_survivors_that_disagree_on_the_exclude_list_all_raise(rank_pool):
    out = rank_pool(3).run_and_discard(_disagree_then_leave_one_out)
    for rank, (first, _) in enumerate(out):
        assert "the survivors disagree on whom to exclude" in first, (rank, first)
        # each shows what it read: a rank that moved on to its next call shows that list
        assert "rank 0 excludes [2]" in first
    assert out[0][1] == out[1][1] == [0, 1]


def _failures_in_a_row(comm, tmp: str):
    """4 ranks: rank 3 is killed, the three survivors shrink; then old rank 1 stops (SIGSTOP)
    and old ranks 0 and 2 shrink past it too. Every communicator runs a random mix of calls
    checked against the references."""
    kept = comm.alloc(16)
    res = soak_rank(comm, 5, 0, 40)
    if comm.rank == 3:
        os.kill(os.getpid(), signal.SIGKILL)
    t = torch.ones(256)
    try:
        comm.all_reduce(t)
        return "the call after the death completed"
    except CommTimeout as e:
        seen = (sorted(e.missing), "exited" in str(e))
    three = comm.shrink([3])
    res3 = soak_rank(three, 6, 0, 60)
    try:
        three.all_reduce(kept)
        refused = ""
    except ValueError as e:
        refused = str(e)
    if comm.rank == 1:
        os.kill(os.getpid(), signal.SIGSTOP)
    try:
        three.all_reduce(t)
        return "the call after the stop completed"
    except CommTimeout as e:
        stopped = sorted(e.missing)
    two = three.shrink([1])
    res2 = soak_rank(two, 7, 0, 60)
    ranks = two.all_gather(torch.tensor([comm.rank])).tolist()
    for c in (two, three, comm):
        c.close()
    wrong = res["wrong"] + res3["wrong"] + res2["wrong"]
    return seen, stopped, refused, ranks, wrong, (three.rank, two.rank)


def test_survivors_shrink_past_a_killed_rank_then_a_stopped_one(tmp_path):
    out = tilecomm.launch(_failures_in_a_row, 4, str(tmp_path), timeout=0.8,
                          keep_going=True)
    assert isinstance(out[3], tilecomm.RankError) and "SIGKILL" in str(out[3])
    assert isinstance(out[1], tilecomm.RankError) and "SIGSTOP" in str(out[1])
    for old, new3, new2 in ((0, 0, 0), (2, 2, 1)):
        seen, stopped, refused, ranks, wrong, numbers = out[old]
        assert seen == ([3], True) and stopped == [1], out[old]
        assert "symmetric heap of the communicator this one replaced" in refused
        assert ranks == [0, 2] and numbers == (new3, new2)
        assert not wrong, wrong


def _grow(comm, ticket_file: str):
    """Ranks of the pool grow their communicator by one rank, which joins with the ticket."""
    g = comm.grow(1, timeout=20)
    if comm.rank == 0:
        with open(ticket_file + ".tmp", "w") as f:
            f.write(g.ticket)
        os.rename(ticket_file + ".tmp", ticket_file)
    grown = g.join()
    res = soak_rank(grown, 8, 0, 40)
    x = torch.full((10,), float(grown.rank + 1))
    grown.all_reduce(x)
    grown.close()
    return grown.rank, grown.world_size, x[0].item(), res["wrong"]


def _newcomer(comm, ticket_file: str):
    """The new process of the grow: a rank of its own launch (this test's process makes no
    torch store: a process forked from it later must not inherit one)."""
    deadline = time.monotonic() + 30
    while not os.path.exists(ticket_file) and time.monotonic() < deadline:
        time.sleep(0.02)
    with open(ticket_file) as f:
        ticket = f.read()
    new = tilecomm.join(ticket, 0)
    res = soak_rank(new, 8, 0, 40)
    x = torch.full((10,), 3.0)
    new.all_reduce(x)
    out = (new.rank, new.world_size, x[0].item(), res["wrong"])
    new.close()
    errors = []
    for bad in ((ticket, 1), ("tcp://127.0.0.1:1/x", 0)):
        try:
            tilecomm.join(*bad)
        except ValueError as e:
            errors.append(str(e))
    return out, errors


def test_grow_adds_a_rank_that_joins_with_the_ticket(rank_pool, tmp_path):
    ticket_file = str(tmp_path / "ticket")
    pool = rank_pool(2)
    got = {}
    runner = threading.Thread(target=lambda: got.setdefault("ranks", pool.run(_grow,
                                                                              ticket_file)))
    runner.start()
    try:
        [(new, errors)] = tilecomm.launch(_newcomer, 1, ticket_file, timeout=20)
    finally:
        runner.join(timeout=60)
    assert new == (2, 3, 6.0, [])
    assert got["ranks"] == [(0, 3, 6.0, []), (1, 3, 6.0, [])]
    assert "index must be an int in 0..0" in errors[0]
    assert "not a ticket" in errors[1]


def _connect_alone(comm):
    from tilecomm.launch import connect

    store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False,
                          timeout=timedelta(seconds=10))
    t0 = time.monotonic()
    try:
        connect(store, 0, 3, timeout=0.5)
        return "connected?"
    except CommTimeout as e:
        return str(e), e.missing, time.monotonic() - t0


def test_init_names_the_rank_that_never_arrives():
    # in a rank of its own: this test's process makes no torch store (see _newcomer)
    [(text, missing, waited)] = tilecomm.launch(_connect_alone, 1)
    assert "rank(s) [1, 2] did not arrive at init" in text and missing == (1, 2)
    assert waited < 5                   # bounded by the timeout, not the store's 10 s


def _bad_exclude_lists(comm):
    errs = []
    for exclude in ([comm.rank], [7], ["x"]):
        try:
            comm.shrink(exclude)
        except ValueError as e:
            errs.append(str(e))
    return errs


def test_shrink_refuses_what_cannot_be_a_survivor_list(rank_pool):
    errs = rank_pool(2).run(_bad_exclude_lists)[0]
    assert "excludes itself" in errs[0]
    assert "outside 0..1" in errs[1]
    assert "must be a list of ranks" in errs[2]

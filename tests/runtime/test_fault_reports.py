"""What a fault says (issue 12, gaps 2, 4 and 5): the culprit of a timeout, a send against a
collective, an all_gather whose ranks agree on the count but not on the row shape."""

from __future__ import annotations

import os
import re
import signal

import pytest
import torch

import tilecomm
from tilecomm import CommMismatch, RankError


def _stop_rank_1(comm):
    t = torch.ones(4)
    comm.all_reduce(t)
    if comm.rank == 1:
        os.kill(os.getpid(), signal.SIGSTOP)     # a rank that stalls (SIGSTOP, a debugger)
    comm.all_reduce(t)


@pytest.mark.slow
def test_a_timeout_names_the_stalled_rank_as_the_culprit():
    with pytest.raises(RankError) as info:
        tilecomm.launch(_stop_rank_1, 3, timeout=1)
    err = info.value
    assert err.culprits == (1,)
    assert err.rank == 0 and err.exc_type == "CommTimeout"       # the reporter ...
    assert str(err).startswith("rank 1 at fault, reported by rank 0: CommTimeout: all_reduce #2")
    assert "--- traceback from rank 0 ---" in str(err)           # ... keeps its traceback
    assert "_stop_rank_1" in err.remote_traceback


def _crossed(comm, who_sends):
    t = torch.ones(4)
    try:
        if comm.rank == who_sends:
            comm.send(t, 1)
        else:
            comm.all_reduce(t)
    except tilecomm.CommError as e:
        return type(e).__name__, str(e)
    return "ok", ""


@pytest.mark.parametrize("world_size", [2, 3])
def test_a_send_against_a_collective_is_a_mismatch_on_both_ranks(world_size):
    with tilecomm.RankGroup(world_size, timeout=20) as g:     # a fresh group: it ends broken
        out = g.run(_crossed, 0)
    assert out[0][0] == "CommMismatch", out[0]
    assert "send #0 on rank 0: rank 1 is in all_reduce #1, not in the matching recv" in out[0][1]
    assert out[1][0] == "CommMismatch", out[1]
    assert "all_reduce #1 on rank 1: rank 0 is in send #0 to rank 1, not in all_reduce #1" \
        in out[1][1]
    if world_size == 3:
        # rank 2 waited for rank 0 in the all_reduce: it stops at once and says what rank 0
        # did, without waiting for the timeout
        assert out[2][0] in ("CommError", "CommTimeout"), out[2]
        assert "rank 0 gave up on collective #1" in out[2][1] or \
            "rank 0 is in send #0 to rank 1" in out[2][1]


def _recv_against(comm):
    t = torch.ones(4)
    try:
        if comm.rank == 1:
            comm.recv(t, 0)
        else:
            comm.barrier()
    except tilecomm.CommError as e:
        return type(e).__name__, str(e)
    return "ok", ""


def test_a_recv_against_a_barrier_is_a_mismatch_too():
    with tilecomm.RankGroup(2, timeout=20) as g:
        out = g.run(_recv_against)
    assert out[1][0] == "CommMismatch" and "rank 0 is in barrier #1" in out[1][1], out[1]
    assert out[0][0] == "CommMismatch" and "rank 1 is in recv #0 from rank 0" in out[0][1]


def _timeout_text(comm):
    if comm.rank == 0:
        try:
            comm.send(torch.ones(2), 1)       # rank 1 computes instead of receiving
        except tilecomm.CommTimeout as e:
            return str(e)
    else:
        import time
        time.sleep(2.0)
    return ""


@pytest.mark.slow
def test_a_timeout_says_what_the_peer_is_doing():
    with tilecomm.RankGroup(2, timeout=0.5) as g:
        out = g.run(_timeout_text)
    assert "rank 1 is in no tilecomm call; its last was init #0" in out[0], out[0]


_WARM = 8      # calls of one tensor after which the executor runs it on its memoized path


def _repeated_then(comm, rank1_does):
    """``_WARM`` all_reduce calls of one tensor, then rank 0 makes one more while rank 1 does
    something else: what each says about the other shows what the executor's memoized native
    path (``Executor.run`` without ``_run``) published. Returns (error type, text, whether
    the last call of this rank took that path)."""
    from tilecomm.backends.cpu.executor import Executor

    t = torch.ones(2)
    for _ in range(_WARM):
        comm.all_reduce(t)
    generic = []
    real = Executor._run

    def spy(self, *args):
        generic.append(True)
        return real(self, *args)

    Executor._run = spy
    try:
        if comm.rank == 0:
            comm.all_reduce(t)
        elif rank1_does == "send":
            comm.send(t, 0)
        else:
            import time
            time.sleep(1.5)
    except tilecomm.CommError as e:
        return type(e).__name__, str(e), not generic
    finally:
        Executor._run = real
    return "ok", "", not generic


@pytest.mark.slow
def test_a_repeated_call_publishes_what_it_does_and_that_it_ended():
    with tilecomm.RankGroup(2, timeout=0.5) as g:
        idle = g.run(_repeated_then, "sleep")
    # ended: rank 1's last all_reduce left it idle
    assert idle[0][0] == "CommTimeout" and idle[0][2], idle[0]
    assert f"rank 1 is in no tilecomm call; its last was all_reduce #{_WARM}" in idle[0][1], \
        idle[0]
    with tilecomm.RankGroup(2, timeout=20) as g:
        crossed = g.run(_repeated_then, "send")
    # in progress: rank 0's all_reduce was published while it waited
    assert crossed[1][0] == "CommMismatch", crossed[1]
    assert f"rank 0 is in all_reduce #{_WARM + 1}" in crossed[1][1], crossed[1]
    assert crossed[0][0] == "CommMismatch" and crossed[0][2], crossed[0]
    assert f"all_reduce #{_WARM + 1} on rank 0: rank 1 is in send #0 to rank 0" in \
        crossed[0][1], crossed[0]


def _rows(comm):
    t = torch.ones(4, 3) if comm.rank == 0 else torch.ones(6, 2)
    try:
        comm.all_gather(t)
    except CommMismatch as e:
        return str(e)
    return "accepted"


def test_all_gather_rows_of_different_shapes_are_a_mismatch_on_every_rank(rank_pool):
    out = rank_pool(3).run(_rows)
    assert out[0].startswith("all_gather #") and "disagree on the row shape" in out[0]
    assert "rank 0: (3,), rank 1: not (3,), rank 2: not (3,)" in out[0]
    for r in (1, 2):
        assert "rank 0: not (2,), rank 1: (2,), rank 2: (2,)" in out[r], out[r]


def _rows_a2a(comm, which):
    """Equal element counts per row, different row shapes (3 x 4 against 4 x 3)."""
    rest = (3, 4) if comm.rank == 0 else (4, 3)
    w = comm.world_size
    try:
        if which == "all_to_all":
            comm.all_to_all(torch.ones(w, *rest))
        else:
            comm.all_to_all_v(torch.ones(w, *rest), [1] * w)
    except CommMismatch as e:
        return str(e)
    return "accepted"


@pytest.mark.parametrize("which", ["all_to_all", "all_to_all_v"])
def test_all_to_all_rows_of_different_shapes_are_a_mismatch_on_every_rank(rank_pool, which):
    out = rank_pool(2).run(_rows_a2a, which)
    for r, text in enumerate(out):
        assert text.startswith(f"{which} #") and "disagree on the row shape" in text, (r, text)
    assert "rank 0: (3, 4), rank 1: not (3, 4)" in out[0]
    assert "rank 0: not (4, 3), rank 1: (4, 3)" in out[1]


def _bad_op(comm):
    try:
        comm.all_reduce(torch.ones(2), op="bogus" if comm.rank == 0 else "sum")
    except Exception as e:  # noqa: BLE001 - the test reads it
        return f"{type(e).__name__}: {e}"
    return "accepted"


def test_a_bad_op_names_the_collective_on_every_rank(rank_pool):
    out = rank_pool(2).run(_bad_op)
    assert out[0] == "ValueError: all_reduce: unknown reduction op 'bogus'; use one of sum, " \
                     "prod, min, max, avg"
    # the pooled ranks' sequence number depends on the tests before
    assert re.fullmatch(r"CommError: all_reduce #\d+: rank 0 rejected its call: all_reduce: "
                        r"ValueError: unknown reduction op 'bogus'; use one of sum, prod, min, "
                        r"max, avg", out[1]), out[1]

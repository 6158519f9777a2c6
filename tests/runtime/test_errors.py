"""Every error path: ranks that disagree, bad arguments, peers that stop or die, cleanup."""

from __future__ import annotations

import os
import signal
import stat
import time

import pytest
import torch

import shm_files
import tilecomm
from tilecomm import CommTimeout, RankError



def _leftover_segments():
    return shm_files.tilecomm_files()


def _catch(fn):
    try:
        fn()
    except Exception as e:  # noqa: BLE001 - the test inspects it
        return type(e).__name__, str(e)
    return None


def _mismatch(comm, case):
    r, w = comm.rank, comm.world_size
    t = torch.ones(8)
    calls = {
        "count": lambda: comm.all_reduce(torch.ones(8 + (r == 1))),
        "dtype": lambda: comm.all_reduce(torch.ones(8, dtype=torch.float64 if r == 1 else
                                                    torch.float32)),
        "op": lambda: comm.all_reduce(t, "max" if r == 1 else "sum"),
        "root": lambda: comm.broadcast(t, root=int(r == 1)),
        "collective": lambda: (comm.broadcast(t) if r == 1 else comm.all_reduce(t)),
        "algorithm": lambda: comm.all_reduce(t, algo="ring" if r == 1 else "two_shot"),
        "split sizes": lambda: comm.all_to_all_v(torch.ones(w), [1] * w,
                                                 [2] + [1] * (w - 2) + [0] if r == 0 else None),
    }
    err = _catch(calls[case])
    # The communicator is still consistent: the next collective works on every rank.
    x = torch.full((4,), float(r))
    comm.all_reduce(x)
    return err, x.tolist()


@pytest.mark.parametrize("case", ["count", "dtype", "op", "root", "collective", "algorithm",
                                  "split sizes"])
def test_mismatch_raises_on_every_rank(rank_pool, case):
    w = 3
    results = rank_pool(w).run(_mismatch, case)
    for r, (err, after) in enumerate(results):
        assert err is not None and err[0] == "CommMismatch", (r, err)
        assert case in err[1], err[1]
        assert after == [float(sum(range(w)))] * 4


def _bad_args(comm, case):
    r, w = comm.rank, comm.world_size
    calls = {
        "root_one_rank": lambda: comm.broadcast(torch.ones(3), root=w + 3 if r == 1 else 0),
        "not_divisible": lambda: comm.reduce_scatter(torch.ones(w + 1)),
        "int8_sum": lambda: comm.all_reduce(torch.ones(3, dtype=torch.int8)),
        "avg_int": lambda: comm.all_reduce(torch.ones(3, dtype=torch.int32), "avg"),
        "bool_dtype": lambda: comm.all_reduce(torch.ones(3, dtype=torch.bool)),
        "bad_algo": lambda: comm.all_reduce(torch.ones(3), algo="nope"),
        "bad_op": lambda: comm.all_reduce(torch.ones(3), "xor"),
        "counts_sum": lambda: comm.all_to_all_v(torch.ones(5), [1] * w),
        "out_shape": lambda: comm.all_gather(torch.ones(3), out=torch.empty(2)),
        "not_tensor": lambda: comm.all_reduce([1, 2, 3]),
    }
    err = _catch(calls[case])
    x = torch.ones(2)
    comm.all_reduce(x)
    return err, x.tolist()


@pytest.mark.parametrize("case,expect", [
    ("root_one_rank", "ValueError"), ("not_divisible", "ValueError"), ("int8_sum", "TypeError"),
    ("avg_int", "TypeError"), ("bool_dtype", "TypeError"), ("bad_algo", "ValueError"),
    ("bad_op", "ValueError"), ("counts_sum", "ValueError"), ("out_shape", "ValueError"),
    ("not_tensor", "TypeError")])
def test_bad_arguments_raise_everywhere(rank_pool, case, expect):
    w = 3
    results = rank_pool(w).run(_bad_args, case)
    for r, (err, after) in enumerate(results):
        assert err is not None, f"rank {r} did not raise for {case}"
        if case == "root_one_rank" and r != 1:
            # The peers learn that rank 1 rejected the call instead of waiting for it.
            assert err[0] == "CommError" and "rank 1 rejected" in err[1], err
            assert "root" in err[1]
        else:
            assert err[0] == expect, err
        assert after == [float(w)] * 2, "communicator unusable after an argument error"


def test_error_messages_say_what_to_change(rank_pool):
    results = rank_pool(2).run(_bad_args, "not_divisible")
    assert "multiple of world_size" in results[0][0][1]
    results = rank_pool(2).run(_bad_args, "int8_sum")
    assert "data movement only" in results[0][0][1]


def _send_mismatch(comm):
    if comm.rank == 0:
        return _catch(lambda: comm.send(torch.ones(4), 1))
    return _catch(lambda: comm.recv(torch.empty(5), 0))


def test_send_recv_mismatch_raises_on_both(rank_pool):
    for err in rank_pool(2).run(_send_mismatch):
        assert err[0] == "CommMismatch" and "4 x float32" in err[1] and "5 x float32" in err[1]


def _bad_peer(comm):
    return [_catch(lambda: comm.send(torch.ones(1), comm.rank)),
            _catch(lambda: comm.recv(torch.ones(1), 7))]


def test_bad_peer(rank_pool):
    for errs in rank_pool(2).run(_bad_peer):
        assert all(e[0] == "ValueError" for e in errs)


# ---- ranks that stop or die (fresh launches: these break the communicator) -----------------

def _one_rank_absent(comm):
    if comm.rank == 1:
        time.sleep(2.5)
        return None
    t0 = time.monotonic()
    try:
        comm.all_reduce(torch.ones(4))
        comm.all_reduce(torch.ones(4))
    except CommTimeout as e:
        waited = time.monotonic() - t0
        after = _catch(lambda: comm.all_reduce(torch.ones(1)))
        return e.collective, e.seq, e.missing, str(e), waited, after
    return "no error"


@pytest.mark.slow
def test_timeout_names_collective_seq_and_missing_rank():
    before = _leftover_segments()
    res = tilecomm.launch(_one_rank_absent, 3, timeout=0.5)
    for r in (0, 2):
        coll, seq, missing, msg, waited, after = res[r]
        assert coll == "all_reduce" and seq == 1 and 1 in missing  # #0 is the init handshake
        assert "all_reduce #1" in msg and "rank" in msg and "1" in msg
        assert waited < 2.4, "timeout not honoured"
        assert after[0] == "CommError" and "unusable" in after[1]
    assert _leftover_segments() <= before


def _rank_dies(comm):
    comm.all_reduce(torch.ones(4))
    if comm.rank == 1:
        os.kill(os.getpid(), signal.SIGKILL)
    comm.all_reduce(torch.ones(4))


def test_killed_rank_is_reported_and_survivors_raise():
    before = _leftover_segments()
    t0 = time.monotonic()
    with pytest.raises(RankError) as info:
        tilecomm.launch(_rank_dies, 3, timeout=30)
    assert time.monotonic() - t0 < 20, "survivors waited for the full timeout"
    err = info.value
    assert err.rank == 1 and "SIGKILL" in str(err)
    # The survivors noticed the dead peer (well before the 30 s timeout) and said so.
    for r in (0, 2):
        assert err.others[r][0] == "CommTimeout" and "exited" in err.others[r][1]
    assert _leftover_segments() <= before


def _raises_in_rank(comm):
    if comm.rank == 2:
        raise KeyError("bad thing on rank two")
    return comm.rank


def test_launch_reports_rank_and_traceback():
    with pytest.raises(RankError) as info:
        tilecomm.launch(_raises_in_rank, 3, timeout=5)
    assert info.value.rank == 2 and info.value.exc_type == "KeyError"
    assert "_raises_in_rank" in info.value.remote_traceback
    assert "bad thing on rank two" in str(info.value)


def test_launch_returns_results_in_rank_order():
    assert tilecomm.launch(lambda comm, k: comm.rank * k, 4, 10) == [0, 10, 20, 30]


def test_segments_are_private_and_unpredictable(tmp_path):
    from tilecomm.heap.shm import create_segment_file, unlink_quietly
    a, b = create_segment_file(str(tmp_path), 4096), create_segment_file(str(tmp_path), 4096)
    try:
        assert stat.S_IMODE(os.stat(a).st_mode) == 0o600
        assert a != b and len(os.path.basename(a)) > len("tilecomm-") + 16
    finally:
        unlink_quietly(a)
        unlink_quietly(b)


def _alloc_diverge(comm):
    sizes = _catch(lambda: comm.alloc(100 if comm.rank == 0 else 10))
    a = comm.alloc(64)
    keep = [comm.alloc(64)]
    if comm.rank == 0:
        del a                      # freed on rank 0 only: the heaps are no longer symmetric
    diverged = _catch(lambda: keep.append(comm.alloc(64)))
    return sizes, diverged


def test_alloc_must_be_collective(rank_pool):
    for sizes, diverged in rank_pool(2).run(_alloc_diverge):
        assert sizes[0] == "CommMismatch" and "bytes" in sizes[1]
        assert diverged[0] == "CommError" and "diverged" in diverged[1]


# ---- regressions found in review ---------------------------------------------------------------

def _free_after_collectives(comm):
    """Plans and memos must not keep a symmetric block alive on some ranks only."""
    import gc
    h = comm.alloc(1)
    h.fill_(comm.rank + 1)
    comm.all_reduce(h, algo="two_shot")
    for i in range(20):                       # more calls than the memo and plan caches hold
        comm.all_reduce(torch.ones(2) * i, algo="one_shot")
    o = comm.alloc(4 * comm.world_size)
    comm.all_gather(torch.ones(4), o)
    for _ in range(70):                       # ranks hit and evict plan-cache entries differently
        comm.all_gather(torch.ones(4)) if comm.rank == 0 else comm.all_gather(
            torch.ones(4), torch.empty(4 * comm.world_size))
    del h, o
    gc.collect()
    return comm._alloc.bytes_in_use, _catch(lambda: comm.alloc(1))


def test_symmetric_blocks_are_freed_alike_on_every_rank():
    res = tilecomm.launch(_free_after_collectives, 3, timeout=20, scratch_bytes=64 << 10)
    for used, err in res:
        assert used == 0 and err is None, (used, err)


def _p2p_timeout(comm):
    if comm.rank == 0:
        time.sleep(2.0)
        return _catch(lambda: comm.send(torch.ones(4), 1))
    first = _catch(lambda: comm.recv(torch.empty(4), 0))
    second = _catch(lambda: comm.recv(torch.empty(4), 0))
    return first, second


@pytest.mark.slow
def test_point_to_point_timeout_makes_the_communicator_unusable():
    res = tilecomm.launch(_p2p_timeout, 2, timeout=0.5)
    first, second = res[1]
    assert first[0] == "CommTimeout" and "recv #0" in first[1]
    assert second[0] == "CommError" and "unusable" in second[1]


def _a2av_piece_mismatch(comm):
    ex = comm._backend.executor
    if comm.rank == 1:
        ex.half_bytes //= 4     # as if TILECOMM_PIECE_BYTES differed on this rank
    return _catch(lambda: comm.all_to_all_v(torch.ones(40000), [20000, 20000]))


def test_all_to_all_v_checks_piece_size():
    for err in tilecomm.launch(_a2av_piece_mismatch, 2, timeout=10, scratch_bytes=64 << 10):
        assert err[0] == "CommMismatch" and "piece size" in err[1]


def _sparse_on_one_rank(comm):
    t = torch.ones(4)
    if comm.rank == 0:
        t = t.to_sparse()
    t0 = time.monotonic()
    return _catch(lambda: comm.all_reduce(t)), time.monotonic() - t0


def test_unsupported_layout_on_one_rank_does_not_hang(rank_pool):
    res = rank_pool(2).run(_sparse_on_one_rank)
    assert res[0][0][0] == "TypeError" and "sparse" in res[0][0][1]
    assert res[1][0][0] == "CommError" and "rank 0 rejected" in res[1][0][1]
    assert res[1][1] < 5


def _memo_with_auto(comm):
    t = torch.ones(16)
    comm.all_reduce(t)
    from tilecomm.calls import memo_key
    key = memo_key("all_reduce", t, "sum", "auto", 0)
    hit = key in comm._calls.small
    comm.all_reduce(t)
    return hit, t[0].item()


def test_call_memo_serves_the_default_auto_algorithm(rank_pool):
    for hit, v in rank_pool(2).run(_memo_with_auto):
        assert hit and v == 4.0


def _late_rank(comm):
    if comm.rank == 1:
        time.sleep(1.5)        # arrives after rank 0 gave up
    return _catch(lambda: comm.all_reduce(torch.ones(4)))


@pytest.mark.slow
def test_a_rank_arriving_after_a_timeout_raises_too():
    """The late rank must not complete a call its peer abandoned (they would disagree)."""
    early, late = tilecomm.launch(_late_rank, 2, timeout=0.5)
    assert early[0] == "CommTimeout"
    assert late is not None and late[0] == "CommError" and "gave up" in late[1], late


def _cuda_without_gpu(comm):
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():                  # a tensor on "cuda" that a CPU-only torch can hold
        t = torch.ones(4, device="cuda")
    return [_catch(lambda: comm.alloc(4, device="cuda")), _catch(lambda: comm.all_reduce(t)),
            _catch(lambda: comm.all_gather(t)), comm.all_reduce(torch.ones(2)).tolist()]


def test_cuda_on_a_machine_without_a_gpu_says_so(rank_pool):
    """A CUDA tensor (or alloc(device="cuda")) without a GPU raised the CUDA heap's CommError
    about device heaps (issue 34): the error names the call and says no CUDA GPU is
    available, and the communicator still works."""
    if torch.cuda.is_available():
        pytest.skip("this test is for machines without CUDA")
    for *errs, after in rank_pool(2).run(_cuda_without_gpu):
        for call, (kind, text) in zip(("alloc", "all_reduce", "all_gather"), errs):
            assert kind == "NoDeviceError", (kind, text)
            assert text.startswith(f"{call}: needs a CUDA GPU"), text
            assert "no CUDA GPU is available on this machine" in text
        assert after == [2.0, 2.0]
    assert issubclass(tilecomm.NoDeviceError, tilecomm.CommError)

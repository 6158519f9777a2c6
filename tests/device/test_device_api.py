"""The device API under the Triton interpreter: tutorials, exact put/get, bounded waits."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

import tilecomm
from tilecomm.device import errors as derr

from .helpers import EXAMPLES, run_tutorial, tutorial

pytestmark = pytest.mark.interpreter


def _env(interpret: bool) -> dict:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    if interpret:
        env["TRITON_INTERPRET"] = "1"
    return env


def test_import_tilecomm_does_not_import_triton():
    code = ("import sys, tilecomm, tilecomm.device, tilecomm.heap.cuda, tilecomm.device.errors;"
            "assert 'triton' not in sys.modules, 'triton imported'")
    subprocess.run([sys.executable, "-c", code], check=True, env=_env(False), timeout=60)


@pytest.mark.parametrize("world_size", [2, 4])
def test_put_get_exact(rank_pool, world_size):
    # 02's run() compares inbox (put) and out (get) exactly with the numpy reference
    checked = rank_pool(world_size, "interpreter").run(run_tutorial, "02_put_get", 300, 64, 2)
    assert checked == [2 * 2 * 300] * world_size


def test_notify_wait(rank_pool):
    seen = rank_pool(2, "interpreter").run(run_tutorial, "01_notify_wait", 16, 3)
    assert seen[0] == [[(i * 10 + e) * 2 for i in range(16)] for e in (1, 2, 3)]


def test_barrier_all_and_subset(rank_pool):
    res = rank_pool(4, "interpreter").run(run_tutorial, "03_barrier", 100, 32, 2)
    assert res[0] == 4        # 2 even ranks x 2 rounds arrived at rank 0's counter


def test_one_shot_all_reduce(rank_pool):
    assert rank_pool(2, "interpreter").run(run_tutorial, "04_one_shot_all_reduce", 200, 64, 3) == [3, 3]


def _bases(comm):
    from tilecomm.device import DeviceHeap

    return DeviceHeap.create(comm).bases.tolist()


def test_heap_bases_are_256_byte_aligned(rank_pool):
    # lang.peer_ptr and lang.barrier hint the rebasing delta bases[peer] - bases[rank] as a
    # multiple of lang.HEAP_ALIGN (256) for 128-bit peer accesses: a base off that would make
    # the compiled vector accesses misaligned
    for bases in rank_pool(2, "interpreter").run(_bases):
        assert len(bases) == 2 and all(b % 256 == 0 for b in bases), bases


def _handle_words(comm):
    """The device handle's words, whether ``bases`` and ``errors`` are views of it, and its
    wait-bound word after ``heap.timeout`` was changed."""
    from tilecomm.device import DeviceHeap
    from tilecomm.device import handle as dh

    heap = DeviceHeap.create(comm, timeout=2.0)
    words = heap.handle.tolist()
    views = (heap.bases.data_ptr() == heap.handle[dh.BASES:].data_ptr(),
             heap.errors.data_ptr() == heap.handle[dh.ERR:].data_ptr())
    heap.timeout = 0.5
    return words, views, int(heap.handle[dh.TIMEOUT_NS])


def test_device_handle_holds_rank_world_bound_and_bases(rank_pool):
    from tilecomm.device import handle as dh

    res = rank_pool(2, "interpreter").run(_handle_words)
    bases = res[0][0][dh.BASES:]
    for r, (words, views, bound) in enumerate(res):
        assert len(words) == dh.BASES + 2
        assert (words[dh.RANK], words[dh.WORLD], words[dh.TIMEOUT_NS]) == (r, 2, 2 * 10**9)
        assert words[dh.SELF_BASE] == words[dh.BASES + r]
        assert words[dh.ERR:dh.ERR + derr.ERR_WORDS] == [0] * derr.ERR_WORDS
        assert views == (True, True)
        assert bound == 5 * 10**8
    # each process maps the segments at its own addresses; the table has every rank's
    assert len(set(bases)) == 2


def _silent_peer(comm, timeout, later=None, abort_after=None):
    """Rank 1 waits for rank 0 in ping_pong; rank 0 never launches it. ``later``: a wait bound
    set on the heap after it was made (the kernel must honor it: it reads the handle).
    ``abort_after``: rank 0 aborts the communicator after that many seconds."""
    from tilecomm.device import DeviceHeap

    mod = tutorial("01_notify_wait")
    heap = DeviceHeap.create(comm, timeout=timeout)
    if later is not None:
        heap.timeout = later
    box = heap.alloc(16, mod.torch.int64)
    pad = heap.signal_pad(2)
    if comm.rank == 0:
        if abort_after is not None:      # rank 0 aborts instead of ever signalling
            import threading
            threading.Timer(abort_after, comm.abort, args=("the host saw a peer fail",)).start()
            time.sleep(abort_after + 0.5)
        return None
    t = time.perf_counter()
    mod.ping_pong[(1,)](box, pad, heap.handle, 7, N=16)
    elapsed = time.perf_counter() - t
    try:
        heap.check("ping_pong")
    except tilecomm.CommAborted as e:
        return type(e).__name__, str(e), e.by, e.rank, e.peer, elapsed
    except tilecomm.CommTimeout as e:
        again = heap.errors.tolist()
        return (type(e).__name__, str(e), e.rank, e.peer, e.epoch, e.slot, e.site, e.missing,
                elapsed, again)
    return ("no error", elapsed)


def test_wait_on_silent_peer_raises_commtimeout(rank_pool):
    t = time.perf_counter()
    _, res = rank_pool(2, "interpreter").run_and_discard(_silent_peer, 0.3)
    assert time.perf_counter() - t < 15
    assert res[0] == "DeviceTimeout", res
    name, msg, rank, peer, epoch, slot, site, missing, elapsed, again = res
    assert (rank, peer, epoch, slot, site, missing) == (1, 0, 7, 0, 1, (0,))
    assert "ping_pong" in msg and "rank 1 timed out" in msg and "rank 0" in msg
    assert "epoch 7" in msg
    assert 0.3 <= elapsed < 10, elapsed
    assert again == [0] * derr.ERR_WORDS      # check() cleared the record


def test_an_abort_ends_a_device_wait_on_every_rank(rank_pool):
    # a 60 s wait bound; rank 0 aborts the communicator after 0.5 s instead of signalling
    # (NOTE [device abort] in device/heap.py)
    _, res = rank_pool(2, "interpreter").run_and_discard(_silent_peer, 60.0, None, 0.5)
    assert res[0] == "DeviceAborted", res
    name, msg, by, rank, peer, elapsed = res
    assert (by, rank, peer) == (0, 1, 0)
    assert "ping_pong: rank 1's device wait for rank 0 (epoch 7) ended early: the " \
           "communicator was aborted by rank 0" in msg
    assert elapsed < 30, elapsed            # cut short, not the 60 s bound


def test_a_new_wait_bound_takes_effect_without_recompiling(rank_pool):
    # made with a 60 s bound, then set to 0.3 s: the kernel reads the bound from the handle
    _, res = rank_pool(2, "interpreter").run_and_discard(_silent_peer, 60.0, 0.3)
    assert res[0] == "DeviceTimeout", res
    elapsed = res[8]
    assert 0.3 <= elapsed < 10, elapsed


def test_decode_error_record():
    assert derr.decode([0] * 8, "k") is None
    words = [derr.BARRIER_TIMEOUT, 3, 1, 42, 9, 40, 5, 2]
    e = derr.decode(words, "all_reduce", timeout=2.0)
    assert isinstance(e, tilecomm.CommTimeout)
    assert (e.rank, e.peer, e.epoch, e.slot, e.observed, e.site, e.count) == (3, 1, 42, 9, 40, 5, 2)
    assert e.collective == "all_reduce" and e.missing == (1,)
    s = str(e)
    assert "rank 3 timed out after 2 s in a device barrier (site 5)" in s
    assert "rank 1" in s and "epoch 42" in s and "holds 40" in s


def test_cuda_heap_fails_clearly_without_cuda():
    import torch
    from tilecomm.heap.cuda import CudaHeap
    if torch.cuda.is_available():
        pytest.skip("a GPU is present")
    with pytest.raises(tilecomm.CommError, match="CudaHeap: .*TRITON_INTERPRET=1"):
        CudaHeap(0, 1, 1 << 20, lambda obj: [obj])


@pytest.mark.slow
@pytest.mark.parametrize("script,world", [("01_notify_wait", 2), ("04_one_shot_all_reduce", 4)])
def test_tutorial_runs_as_script(script, world):
    r = subprocess.run([sys.executable, os.path.join(EXAMPLES, script + ".py"), str(world)],
                       env=_env(True), capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout.strip().endswith("ok")


@pytest.mark.slow
@pytest.mark.compile
def test_every_kernel_compiles_for_sm90():
    files = sorted(os.path.join(EXAMPLES, f) for f in os.listdir(EXAMPLES) if f.endswith(".py"))
    r = subprocess.run([sys.executable, "-m", "tilecomm.device.compile_check", *files],
                       env=_env(False), capture_output=True, text=True, timeout=300)
    if r.returncode == 3:
        pytest.skip(r.stderr.strip())
    assert r.returncode == 0, r.stdout + r.stderr
    ok = [line for line in r.stdout.splitlines() if line.startswith("ok ")]
    assert len(ok) >= len(files) and "all compiled" in r.stdout, r.stdout


def test_ptx_ordering_check_flags_unsynchronized_release_and_acquire():
    # compile_check runs this on every compiled kernel: a release atomic must follow a CTA
    # barrier in its block (other threads' stores are published), an acquire fence must be
    # followed by one before data accesses (other threads' loads come after it)
    from tilecomm.device.compile_check import ordering_problems

    rel = "@%p1 atom.global.sys.release.exch.b64 %rd1, [ %rd2 + 0 ], %rd3;\n"
    assert ordering_problems("bar.sync 0;\n" + rel) == []
    assert ordering_problems("st.global.b32 [ %rd1 + 0 ], %r1;\n" + rel)
    assert ordering_problems("bar.sync 0;\n@%p2 st.global.b32 [ %rd1 + 0 ], %r1;\n" + rel)
    assert ordering_problems("bar.sync 0;\n$L__BB0_2:\n" + rel)
    acq = "ld.relaxed.sys.global.b64 %rd1, [ %rd2 + 0 ];\nfence.acquire.sys;\n"
    assert ordering_problems(acq + "st.shared.b64 [x], %rd1;\nbar.sync 0;\n"
                             "ld.global.b32 %r1, [ %rd4 + 0 ];\n") == []
    assert ordering_problems(acq + "ld.global.b32 %r1, [ %rd4 + 0 ];\n")

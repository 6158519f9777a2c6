"""The asynchronous GPU call path (NOTE [asynchronous calls] in backends/triton/__init__.py),
in the Triton interpreter: by default a collective makes no host handshake and reads no error
word; debug mode (TILECOMM_DEVICE_DEBUG) does both per call; mismatches are caught at the next
check point (or at once in debug mode); a device timeout is raised at the next check point
(comm.synchronize(), a periodic check, close) naming the call that failed."""

from __future__ import annotations

import pytest

import time

import torch
from interp_ranks import kernel_backend

import tilecomm

pytestmark = pytest.mark.interpreter

CALLS = 5


# ---- rank side ---------------------------------------------------------------------------------

class _Counter:
    """Counts the host synchronizations of a TritonBackend's call path by patching the entry
    points: the host rendezvous, heap.check, the error-word reads and torch.cuda.synchronize."""

    def __init__(self, b):
        self.n = {"rendezvous": 0, "heap.check": 0, "error_words": 0, "poll_error_words": 0,
                  "torch.cuda.synchronize": 0, "errors.check": 0}
        self.undo = []
        host = b.host.backend
        self._wrap(host, "rendezvous", "rendezvous")
        self._wrap(b.heap, "check", "heap.check")
        self._wrap(b.heap, "error_words", "error_words")
        self._wrap(b.heap, "poll_error_words", "poll_error_words")
        self._wrap(torch.cuda, "synchronize", "torch.cuda.synchronize")
        from tilecomm.device import errors as errmod
        self._wrap(errmod, "check", "errors.check")

    def _wrap(self, obj, attr, key):
        orig = getattr(obj, attr)
        own = attr in vars(obj)          # a module's function, else a method of the class

        def counted(*a, **k):
            self.n[key] += 1
            return orig(*a, **k)

        setattr(obj, attr, counted)
        self.undo.append((obj, attr, orig, own))

    def close(self):
        for obj, attr, orig, own in reversed(self.undo):
            if own:
                setattr(obj, attr, orig)
            else:
                delattr(obj, attr)


def _calls(comm, b, sym):
    """CALLS rounds of every kernel family, on heap tensors (zero copy) and plain tensors;
    returns the results of the last round."""
    from tilecomm.backends.base import CollectiveCall
    from tilecomm.types import ReduceOp, lookup_dtype

    w, r, n = comm.world_size, comm.rank, 40
    d = lookup_dtype(torch.float32)
    out = {}
    for k in range(CALLS):
        for algo, name in (("one_shot", "ar"), ("two_shot", "ar2")):
            y = sym[name] if sym else torch.empty(n)
            y.copy_(torch.arange(n, dtype=torch.float32) + r + k)
            b.run(CollectiveCall("all_reduce", algo, d, n, {"buf": y}, op=ReduceOp.SUM))
            out[algo] = y.clone()
        src = sym["ag"] if sym else torch.empty(n)
        src.fill_(float(r + k))
        ag = torch.empty(w * n)
        b.run(CollectiveCall("all_gather", "direct", d, n, {"in": src, "out": ag}))
        out["all_gather"] = ag
        rs_in = sym["rs"] if sym else torch.empty(w * n)
        rs_in.copy_(torch.arange(w * n, dtype=torch.float32) * (r + 1))
        rs = torch.empty(n)
        b.run(CollectiveCall("reduce_scatter", "direct", d, w * n, {"in": rs_in, "out": rs},
                             op=ReduceOp.SUM))
        out["reduce_scatter"] = rs
        bc = sym["bc"] if sym else torch.empty(n)
        bc.fill_(float(r * 10 + k))
        b.run(CollectiveCall("broadcast", "direct", d, n, {"buf": bc}, root=0))
        out["broadcast"] = bc.clone()
    return out


def _check_results(comm, out):
    w, r, n, k = comm.world_size, comm.rank, 40, CALLS - 1
    ar = sum(torch.arange(n, dtype=torch.float32) + q + k for q in range(w))
    assert torch.equal(out["one_shot"], ar) and torch.equal(out["two_shot"], ar)
    assert torch.equal(out["all_gather"],
                       torch.cat([torch.full((n,), float(q + k)) for q in range(w)]))
    full = sum(torch.arange(w * n, dtype=torch.float32) * (q + 1) for q in range(w))
    assert torch.equal(out["reduce_scatter"], full[r * n:(r + 1) * n])
    assert torch.equal(out["broadcast"], torch.full((n,), float(k)))


def _count_syncs(comm, debug):
    b = kernel_backend(comm)
    b.debug = debug
    b.check_every = 10**6
    w, n = comm.world_size, 40
    sym = {"ar": comm.alloc(n), "ar2": comm.alloc(n), "ag": comm.alloc(n),
           "rs": comm.alloc(w * n), "bc": comm.alloc(n)}
    _calls(comm, b, sym)               # warm: scratch and pads grow (collectively) here
    _calls(comm, b, None)
    res = {}
    for placement, s in (("heap", sym), ("plain", None)):
        c = _Counter(b)
        try:
            first = b.calls
            out = _calls(comm, b, s)
            zero_copy = b.ctx.zero_copy
            made = b.calls - first
        finally:
            c.close()
        _check_results(comm, out)
        res[placement] = (dict(c.n), made, zero_copy)
    b.debug = False
    b.check_every = 64
    comm.barrier()
    return res


def _mismatch(comm, debug):
    """Rank 1 reduces 40 elements where rank 0 reduces 41 (same kernel): debug mode raises
    CommMismatch at the call; the asynchronous mode at the next check point, on every rank."""
    from tilecomm.backends.base import CollectiveCall
    from tilecomm.types import ReduceOp, lookup_dtype

    b = kernel_backend(comm)
    b.debug, b.check_every = debug, 3
    b.calls = 0
    b._digest, b._digest_from = 0, 1
    d = lookup_dtype(torch.float32)
    seen = []
    try:
        for k in range(3):
            n = 41 if (k == 1 and comm.rank == 0) else 40
            x = torch.ones(n)
            try:
                b.run(CollectiveCall("all_reduce", "one_shot", d, n, {"buf": x}, op=ReduceOp.SUM))
                seen.append((k, "ok"))
            except tilecomm.CommMismatch as e:
                seen.append((k, str(e)))
    finally:
        b.debug, b.check_every = False, 64
    comm.barrier()
    return seen


def _placement_mismatch(comm):
    """Debug mode: a heap tensor on rank 0, a plain tensor on rank 1 -> CommMismatch."""
    from tilecomm.backends.base import CollectiveCall
    from tilecomm.types import ReduceOp, lookup_dtype

    b = kernel_backend(comm)
    b.debug = True
    sym = comm.alloc(16)
    x = sym if comm.rank == 0 else torch.ones(16)
    try:
        b.run(CollectiveCall("all_reduce", "one_shot", lookup_dtype(torch.float32), 16,
                             {"buf": x}, op=ReduceOp.SUM))
        res = "no error"
    except tilecomm.CommMismatch as e:
        res = str(e)
    finally:
        b.debug = False
    comm.barrier()
    return res


def _silent_peer_found_at_synchronize(comm):
    """Rank 0 skips an all_reduce; rank 1's call returns (asynchronous) and comm.synchronize()
    raises the device timeout naming the call, the rank, the peer and the epoch."""
    from tilecomm.backends.base import CollectiveCall
    from tilecomm.backends.triton import TritonBackend
    from tilecomm.types import ReduceOp, lookup_dtype

    b = TritonBackend(comm, "cpu", timeout=0.3)        # own epochs, pad and scratch
    assert not b.debug
    d = lookup_dtype(torch.float32)

    def all_reduce(algo="one_shot"):
        b.run(CollectiveCall("all_reduce", algo, d, 16, {"buf": torch.ones(16)},
                             op=ReduceOp.SUM))

    all_reduce()
    all_reduce("two_shot")                    # warm (collective allocations)
    saved = comm._backends.get("cpu")
    comm._backends["cpu"] = b                 # comm.synchronize() reaches this backend
    try:
        if comm.rank == 0:
            comm.barrier()
            return None
        t = time.perf_counter()
        all_reduce("two_shot")                # rank 0 never launches it
        epoch = b.ctx.epoch
        returned = time.perf_counter() - t
        later = time.perf_counter()
        all_reduce()                          # gives up at once: the record is still set
        later = time.perf_counter() - later
        try:
            comm.synchronize()
            res = ("no error",)
        except tilecomm.CommTimeout as e:
            res = (type(e).__name__, e.rank, e.peer, e.epoch == epoch, e.kernel, e.seq,
                   str(e), returned, later)
        again = "clean"
        try:
            comm.synchronize()                # the record was cleared when reported
        except tilecomm.CommTimeout:
            again = "raised twice"
        comm.barrier()
        return res + (again,)
    finally:
        if saved is not None:
            comm._backends["cpu"] = saved
        else:
            comm._backends.pop("cpu", None)
        try:
            b.close()
        except tilecomm.CommMismatch:
            pass        # the ranks' calls differ on purpose, and close compares them


def _error_found_at_periodic_check(comm):
    """A device record of call #2 (written by hand on rank 1) is raised at the periodic check
    point of call #4 (check_every 2: the non-blocking poll at #4 sees it), naming call #2."""
    from tilecomm.backends.base import CollectiveCall
    from tilecomm.backends.triton import TritonBackend
    from tilecomm.device import errors as E
    from tilecomm.types import ReduceOp, lookup_dtype

    b = TritonBackend(comm, "cpu", timeout=5)
    b.check_every = 2
    d = lookup_dtype(torch.float32)
    got = []
    try:
        for k in range(1, 5):
            try:
                b.run(CollectiveCall("all_gather" if k == 2 else "all_reduce",
                                     "direct" if k == 2 else "one_shot", d, 8,
                                     {"in": torch.ones(8), "out": torch.empty(8 * comm.world_size)}
                                     if k == 2 else {"buf": torch.ones(8)},
                                     op=None if k == 2 else ReduceOp.SUM))
                got.append((k, "ok"))
            except tilecomm.CommTimeout as e:
                got.append((k, e.kernel, e.seq, e.rank, e.peer, str(e)))
            if k == 2 and comm.rank == 1:     # "a wait of call #2 gave up"
                rec = [E.WAIT_TIMEOUT, 1, 0, b.ctx.epoch, 3, 0, 1, 1]
                b.heap.errors.copy_(torch.tensor(rec, dtype=torch.int64))
    finally:
        comm.barrier()
        b.close()
    return got


# ---- pytest side -------------------------------------------------------------------------------

def test_default_calls_make_no_host_synchronization(rank_pool):
    res = rank_pool(2, "interpreter").run(_count_syncs, False)
    for r in res:
        for placement in ("heap", "plain"):
            counts, made, zero_copy = r[placement]
            assert made == 5 * CALLS
            assert zero_copy == (placement == "heap")
            assert all(v == 0 for v in counts.values()), (placement, counts)


def test_debug_mode_handshakes_and_checks_every_call(rank_pool):
    res = rank_pool(2, "interpreter").run(_count_syncs, True)
    for r in res:
        for placement in ("heap", "plain"):
            counts, made, _ = r[placement]
            assert counts["rendezvous"] == made and counts["heap.check"] == made, counts


def test_mismatch_raises_at_the_call_in_debug_mode(rank_pool):
    res = rank_pool(2, "interpreter").run(_mismatch, True)
    for seen in res:
        assert seen[0] == (0, "ok") and seen[2] == (2, "ok"), seen
        assert "ranks disagree on count" in seen[1][1], seen


def test_mismatch_raises_at_the_next_check_point_by_default(rank_pool):
    res = rank_pool(2, "interpreter").run(_mismatch, False)
    for seen in res:
        assert seen[0] == (0, "ok") and seen[1] == (1, "ok"), seen
        k, msg = seen[2]
        assert k == 2 and "GPU collectives #1..#3 differ between ranks" in msg, seen
        assert "TILECOMM_DEVICE_DEBUG=1" in msg


def test_debug_mode_names_different_input_placements(rank_pool):
    res = rank_pool(2, "interpreter").run(_placement_mismatch)
    for msg in res:
        assert "rank 0: heap offset" in msg and "rank 1: outside the symmetric heap" in msg, msg


def test_silent_peer_raises_commtimeout_at_synchronize(rank_pool):
    res = rank_pool(2, "interpreter").run_and_discard(_silent_peer_found_at_synchronize)
    assert res[0] is None
    name, rank, peer, same_epoch, kernel, seq, msg, returned, later, again = res[1]
    assert name == "DeviceTimeout"
    assert (rank, peer, same_epoch) == (1, 0, True)
    assert kernel == "all_reduce/two_shot" and seq == 3
    assert "all_reduce/two_shot: rank 1 timed out" in msg and "epoch" in msg
    assert "comm.synchronize()" in msg and "GPU call #3" in msg
    assert 0.3 <= returned < 15          # the interpreter runs the kernel in the call
    assert later < returned              # the next call gives up at once
    assert again == "clean"


def test_device_error_raised_at_the_periodic_check_names_the_failed_call(rank_pool):
    res = rank_pool(2, "interpreter").run_and_discard(_error_found_at_periodic_check)
    assert res[0] == [(k, "ok") for k in range(1, 5)]
    got = res[1]
    assert got[:3] == [(1, "ok"), (2, "ok"), (3, "ok")], got
    k, kernel, seq, rank, peer, msg = got[3]
    assert (k, kernel, seq, rank, peer) == (4, "all_gather/direct", 2, 1, 0), got
    assert "at the check point after call #4" in msg


def _short_run_mismatch_and_rejection(comm):
    """Fewer calls than a check interval: a placement mismatch (heap tensors at different
    offsets) is still reported, at close; a call one rank rejects raises the original error
    there at once and CommMismatch on every rank at the next check point (no later call pairs
    with the refused one); a call every rank rejects leaves the backend usable."""
    from tilecomm.backends.triton import TritonBackend

    out = []
    b = TritonBackend(comm, "cpu", timeout=2)
    saved = comm._backends.get("cpu")
    comm._backends["cpu"] = b
    try:
        x = torch.ones(8)
        comm.all_reduce(x)
        try:                                        # every rank refuses alike
            comm.all_reduce(torch.ones(8), op="bogus")
        except ValueError:
            out.append("ValueError")
        y = torch.ones(8)
        comm.all_reduce(y)
        out.append(y[0].item())
        try:                                        # only rank 0 refuses
            comm.all_reduce(torch.ones(8), op="bogus" if comm.rank == 0 else "sum")
            out.append("launched")
        except ValueError:
            out.append("ValueError")
        try:
            comm.all_reduce(torch.ones(8))          # rank 0: the check point comes first
            comm.barrier()
            out.append("no error")
        except (tilecomm.CommMismatch, tilecomm.CommTimeout) as e:
            out.append(type(e).__name__)
    finally:
        comm._backends["cpu"] = saved if saved is not None else comm._backends.pop("cpu")
        # the ranks' calls are out of step now (rank 1 launched two more); drop what is left
        # to compare so that the two closes below stay in step, then release
        b._digest_from, b._force_check = b.calls + 1, False
        b.close()
    # a fresh backend: heap tensors at different offsets, two calls, then close
    b = TritonBackend(comm, "cpu", timeout=2)
    comm._backends["cpu"] = b
    try:
        first, second = b.alloc((16,)), b.alloc((16,))     # collective: same on every rank
        t = first if comm.rank == 0 else second              # ...but used at other offsets
        t.fill_(1.0)
        comm.all_reduce(t, algo="two_shot")
        del first, second, t
    finally:
        comm._backends["cpu"] = saved if saved is not None else comm._backends.pop("cpu")
    try:
        b.close()
        out.append("closed quietly")
    except tilecomm.CommMismatch as e:
        out.append("CommMismatch at close" if "heap offset" in str(e) else str(e))
    return out


@pytest.mark.slow
def test_short_runs_and_rejections_are_reported(rank_pool):
    res = rank_pool(2, "interpreter").run(_short_run_mismatch_and_rejection)
    assert res[0][:3] == ["ValueError", 2.0, "ValueError"]
    assert res[1][:3] == ["ValueError", 2.0, "launched"]
    assert res[0][3] == "CommMismatch" and res[1][3] in ("CommMismatch", "CommTimeout"), res
    assert res[0][4] == res[1][4] == "CommMismatch at close", res

"""The GPU check's timing arithmetic without a GPU: CUDA-graph timing (capture ``k`` calls,
replay, divide) against a stand-in for torch's graph API, and the memory bound per operation."""

from __future__ import annotations

import contextlib
import types

import pytest
import torch

from tilecomm.bench import runner
from tilecomm.bench.gpucheck import timing

pytestmark = pytest.mark.gpu


class _Graph:
    """Capture records the calls made inside ``torch.cuda.graph(g)``; replay makes them."""

    def __init__(self):
        self.calls = []

    def replay(self):
        for fn in self.calls:
            fn()


def _fake_cuda(monkeypatch, log):
    capturing = []

    @contextlib.contextmanager
    def graph(g, capture_error_mode="global"):
        capturing.append(g)
        try:
            yield
        finally:
            capturing.pop()

    stream = types.SimpleNamespace(wait_stream=lambda s: None)
    monkeypatch.setattr(torch.cuda, "Stream", lambda dev=None: stream)
    monkeypatch.setattr(torch.cuda, "current_stream", lambda dev=None: stream)
    monkeypatch.setattr(torch.cuda, "stream", lambda s: contextlib.nullcontext())
    monkeypatch.setattr(torch.cuda, "graph", graph)
    monkeypatch.setattr(torch.cuda, "CUDAGraph", _Graph)

    def call():
        if capturing:                         # captured, not run
            capturing[-1].calls.append(lambda: log.append("call"))
        else:
            log.append("call")
    return call


def _rk(iters, rounds=3, warmup=1):
    comm = types.SimpleNamespace(barrier=lambda: None)
    return types.SimpleNamespace(cfg=dict(iters=iters, rounds=rounds, warmup=warmup),
                                 runner=runner, comm=comm, dev=torch.device("cpu"),
                                 sync=lambda: None)


@pytest.mark.parametrize("iters,chunk", [(20, None), (20, 6), (5, 100)])
def test_graph_timing_replays_k_captured_calls_and_divides_by_k(monkeypatch, iters, chunk):
    log = []
    call = _fake_cuda(monkeypatch, log)
    fills = []
    refill = (lambda: fills.append(len(log))) if chunk else None
    secs = timing.timed(_rk(iters), call, graph=True, refill=refill, chunk=chunk)
    k = min(iters, chunk or iters)
    reps = max(1, iters // k)
    # one warm call, then per round (1 warm-up replay + reps timed replays) of k calls each
    assert log.count("call") == 1 + (1 + 3 * reps) * k
    assert len(secs) == 3 and all(s >= 0 for s in secs)
    if chunk:
        # every replay starts from fresh data: a refill before each, none inside a replay
        assert fills[1:] == sorted(fills[1:]) and all(f % k == 1 for f in fills[1:]), fills


def test_eager_timing_is_the_bench_rounds(monkeypatch):
    log = []
    secs = timing.timed(_rk(4), lambda: log.append(1), graph=False)
    assert len(secs) == 3 and len(log) == 1 + 3 * 4


def test_bound_per_operation():
    gb = dict(copy_GBps=1000.0, gpus=1)
    # all_reduce: each rank writes 2 (W-1)/W of the buffer; 4 ranks on one HBM
    kind, us = timing.bound_us("all_reduce", 4, 1 << 30, gb)
    assert kind == "device copy" and us == pytest.approx(4 * 1.5 * (1 << 30) / 1e9 * 1e3)
    assert timing.bound_us("broadcast", 2, 1000, gb)[1] == pytest.approx(2 * 1000 / 1e6)
    assert timing.bound_us("all_gather", 2, 1000, dict(gb, gpus=2, nvlink_GBps=500.0)) == \
        ("nvlink", pytest.approx(500 / 500.0 / 1e3))
    assert timing.bound_us("all_to_all", 2, 1000, {}) == (None, None)


def _one_rank_raises_before_a_barrier(comm):
    from tilecomm.bench.gpucheck.rank import RankCheck
    rk = RankCheck(comm, dict(interpret=False, device_heap_bytes=None), "cpu", None)
    err = None
    try:
        if comm.rank == 1:
            raise RuntimeError("rank 1's case failed before its barrier")
        comm.barrier()                         # rank 0: a timed round's barrier
    except Exception as e:  # noqa: BLE001 - as timing.measure does
        err = f"{type(e).__name__}: {e}"
    seen = rk.failed_elsewhere(err) if not rk.all_ok(err is None) else None
    rk.comm.barrier()                          # and the world goes on in step
    return seen, rk.gather([comm.rank])


def test_a_rank_that_fails_before_its_peers_barrier_keeps_the_world_in_step(rank_pool):
    """Rank 1's case raises before the barrier rank 0 is in: both calls fail as mismatched,
    and the agreement after it still meets (RankCheck.gather retries once), so every rank
    learns what happened instead of the world ending."""
    got = rank_pool(2).run(_one_rank_raises_before_a_barrier)
    assert got[1][0].startswith("RuntimeError: rank 1's case failed")
    assert "CommMismatch" in got[0][0] or "failed on rank 1" in got[0][0], got
    assert got[0][1] == got[1][1] == [[0], [1]]

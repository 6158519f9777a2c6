"""CUDA graph replays of collectives, shown in the Triton interpreter (NOTE [device epochs] in
backends/triton/context.py).

A CUDA graph replays what was captured with the captured host arguments. Here a call's launches
are *recorded* (what a capture would hold): the device-epoch increment (``epoch_dev += 1``,
a torch op on the stream) and every kernel launch with its exact host arguments (tensors,
sizes, grid). The tape is then *replayed* on every rank, several times back to back, with the
inputs changed in place between replays, as one would before ``graph.replay()``: every replay
must give the exact result. With the epoch and the scratch parity passed from the host (the
old kernels), a replay's waits were satisfied by the previous run's signals and it read
whatever the peers' staging halves held. A replay on which one rank does not take part makes
the others time out (stale signals do not satisfy it), naming rank, peer and epoch.
"""

from __future__ import annotations

import pytest

import sys

import torch
from interp_ranks import kernel_backend

import tilecomm

pytestmark = pytest.mark.interpreter

REPLAYS = 4
FAMILIES = ("all_reduce", "gather_scatter", "all_to_all", "broadcast", "plan")


# ---- rank side ---------------------------------------------------------------------------------

def _kernels():
    """The Triton kernels defined in the kernel families (interpreted functions here)."""
    from tilecomm.backends.triton import registry

    registry.load()
    out = []
    for fam in FAMILIES:
        name = f"tilecomm.backends.triton.kernels.{fam}"
        for obj in vars(sys.modules[name]).values():
            fn = getattr(obj, "fn", None)
            if hasattr(obj, "run") and getattr(fn, "__module__", None) == name:
                out.append(obj)
    return out


#: host-side tensor operations that allocate or synchronize (on CUDA: a host allocation, a
#: host-to-device copy or a device synchronization, none of which a capture allows)
HOST_OPS = [(torch, "tensor"), (torch, "empty"), (torch, "zeros"), (torch, "full"),
            (torch, "empty_like"), (torch, "zeros_like"), (torch.Tensor, "to"),
            (torch.Tensor, "cpu"), (torch.Tensor, "item"), (torch.Tensor, "tolist"),
            (torch.Tensor, "clone"), (torch.Tensor, "copy_"), (torch.cuda, "synchronize")]


def record(b, fn, host_ops=None):
    """Run ``fn()`` (collectives through backend ``b``) and return its tape: ``("add", t, k)``
    for each device-epoch increment and ``("launch", name, run, args, kwargs)`` for each
    kernel launch, in stream order; the host arguments are kept as they were passed.
    ``host_ops`` (a dict): counts the :data:`HOST_OPS` the call path made outside the kernels
    (the interpreter's own work inside a launch is not counted)."""
    tape = []
    ctx = b.ctx
    advance = ctx.advance
    inside = [0]

    def recorded_advance():
        tape.append(("add", ctx.epoch_dev, 1))
        inside[0] += 1
        try:
            advance()
        finally:
            inside[0] -= 1

    undo = []
    for k in _kernels():
        run = k.run

        def recorded_run(*a, _run=run, _name=k.fn.__name__, **kw):
            tape.append(("launch", _name, _run, a, dict(kw)))
            inside[0] += 1
            try:
                return _run(*a, **kw)
            finally:
                inside[0] -= 1

        k.run = recorded_run
        undo.append((k, run, True))
    if host_ops is not None:
        for obj, attr in HOST_OPS:
            orig = getattr(obj, attr)

            def counted(*a, _orig=orig, _key=f"{getattr(obj, '__name__', obj)}.{attr}", **kw):
                if not inside[0]:
                    host_ops[_key] = host_ops.get(_key, 0) + 1
                return _orig(*a, **kw)

            own = attr in vars(obj)
            setattr(obj, attr, counted)
            undo.append((obj, (attr, orig, own), False))
    ctx.advance = recorded_advance
    try:
        fn()
    finally:
        del ctx.advance
        for obj, saved, is_kernel in reversed(undo):
            if is_kernel:
                obj.run = saved
            else:
                attr, orig, own = saved
                if own:
                    setattr(obj, attr, orig)
                else:
                    delattr(obj, attr)
    return tape


def replay(tape):
    """Execute the tape again, as a CUDA graph replay does: the same increments, the same
    kernels with the same host arguments; nothing of the host-side call path runs."""
    for step in tape:
        if step[0] == "add":
            step[1].add_(step[2])
        else:
            _, _, run, a, kw = step
            run(*a, **kw)


def _set_fused(b, fused):
    from tilecomm.backends.triton import registry

    registry.FUSED = fused
    b._specs.clear()


def _graph(comm, b, n, sym):
    """The buffers and calls of one "graph" of collectives: one_shot (plain tensor), two_shot
    (heap tensor: zero copy), two_shot (plain), all_gather direct, reduce_scatter ring,
    broadcast, all_to_all, and two plan-kernel calls (all_reduce ring, all_gather direct
    with the fused kernels off). ``fill(k)`` writes replay k's inputs in place; ``check(k)``
    returns what differs from the exact results."""
    from tilecomm.backends.base import CollectiveCall
    from tilecomm.types import ReduceOp, lookup_dtype

    w, r = comm.world_size, comm.rank
    d = lookup_dtype(torch.float32)
    ar = torch.arange(n, dtype=torch.float32)
    bufs = {"one_shot": torch.empty(n), "two_shot_heap": sym, "two_shot": torch.empty(n),
            "ag_in": torch.empty(n), "ag_out": torch.empty(w * n),
            "rs_in": torch.empty(w * n), "rs_out": torch.empty(n),
            "bc": torch.empty(n), "a2a_in": torch.empty(w * n), "a2a_out": torch.empty(w * n),
            "plan_ar": torch.empty(n), "plan_ag_in": torch.empty(n),
            "plan_ag_out": torch.empty(w * n)}

    def inp(q, k, salt):
        return ar * (q + 1) + 1000 * k + 100 * salt + q

    def fill(k):
        for salt, name in enumerate(("one_shot", "two_shot_heap", "two_shot", "plan_ar")):
            bufs[name].copy_(inp(r, k, salt))
        bufs["ag_in"].copy_(inp(r, k, 5))
        bufs["plan_ag_in"].copy_(inp(r, k, 6))
        bufs["rs_in"].copy_(torch.cat([inp(r, k, 7 + j) for j in range(w)]))
        bufs["bc"].copy_(inp(r, k, 20) if r == 1 % w else torch.full((n,), -1.0))
        bufs["a2a_in"].copy_(torch.cat([inp(r, k, 30 + j) for j in range(w)]))
        for name in ("ag_out", "rs_out", "a2a_out", "plan_ag_out"):
            bufs[name].fill_(float("nan"))      # poisoned outputs

    def run():
        S = ReduceOp.SUM
        b.run(CollectiveCall("all_reduce", "one_shot", d, n, {"buf": bufs["one_shot"]}, op=S))
        b.run(CollectiveCall("all_reduce", "two_shot", d, n, {"buf": bufs["two_shot_heap"]},
                             op=S))
        b.run(CollectiveCall("all_reduce", "two_shot", d, n, {"buf": bufs["two_shot"]}, op=S))
        b.run(CollectiveCall("all_gather", "direct", d, n,
                             {"in": bufs["ag_in"], "out": bufs["ag_out"]}))
        b.run(CollectiveCall("reduce_scatter", "ring", d, w * n,
                             {"in": bufs["rs_in"], "out": bufs["rs_out"]}, op=S))
        b.run(CollectiveCall("broadcast", "direct", d, n, {"buf": bufs["bc"]}, root=1 % w))
        b.run(CollectiveCall("all_to_all", "pairwise", d, w * n,
                             {"in": bufs["a2a_in"], "out": bufs["a2a_out"]}))
        b.run(CollectiveCall("all_reduce", "ring", d, n, {"buf": bufs["plan_ar"]}, op=S))
        _set_fused(b, False)
        try:
            b.run(CollectiveCall("all_gather", "direct", d, n,
                                 {"in": bufs["plan_ag_in"], "out": bufs["plan_ag_out"]}))
        finally:
            _set_fused(b, None)

    def check(k):
        want = {name: sum(inp(q, k, salt) for q in range(w)) for salt, name in
                enumerate(("one_shot", "two_shot_heap", "two_shot", "plan_ar"))}
        want["ag_out"] = torch.cat([inp(q, k, 5) for q in range(w)])
        want["plan_ag_out"] = torch.cat([inp(q, k, 6) for q in range(w)])
        want["rs_out"] = sum(inp(q, k, 7 + r) for q in range(w))
        want["bc"] = inp(1 % w, k, 20)
        want["a2a_out"] = torch.cat([inp(q, k, 30 + r) for q in range(w)])
        return [name for name, v in want.items() if not torch.equal(bufs[name], v)]

    return fill, run, check


def _replays(comm):
    """Record one graph of collectives (eager, checked), replay it REPLAYS times back to back
    with new inputs each time (each checked), then run eager calls again (checked)."""
    b = kernel_backend(comm)
    every, b.check_every = b.check_every, 10**6      # no check point inside the graph
    n = 40
    sym = comm.alloc(n)
    fill, run, check = _graph(comm, b, n, sym)
    fill(0)
    run()                                    # warm: pads and scratch grow here
    bad = {0: check(0)}
    fill(1)
    host_ops: dict = {}
    tape = record(b, run, host_ops)
    bad[1] = check(1)
    kinds = [s[1] for s in tape if s[0] == "launch"]
    adds = sum(1 for s in tape if s[0] == "add")
    host = b.ctx.epoch
    dev = []
    for k in range(2, 2 + REPLAYS):
        fill(k)
        replay(tape)
        bad[k] = check(k)
        dev.append(b.ctx.device_epoch())
    behind = (b.ctx.epoch, host)              # the host count did not move
    k = 2 + REPLAYS
    fill(k)
    run()                                    # eager again, device epochs ahead of the host's
    bad[k] = check(k)
    b.synchronize()                          # resync: the host count catches up
    synced = (b.ctx.epoch, b.ctx.device_epoch())
    b.check_every = every
    comm.barrier()
    return {"bad": bad, "kinds": kinds, "adds": adds, "host": host, "dev": dev,
            "behind": behind, "synced": synced, "host_ops": host_ops}


def _stale_replay_times_out(comm):
    """A recorded one_shot replayed on every rank, then once more on rank 1 only: rank 1's
    replay must time out (its peer's signals are from the previous replay), naming rank 1,
    peer 0 and the replay's device epoch."""
    from tilecomm.backends.base import CollectiveCall
    from tilecomm.backends.triton import TritonBackend
    from tilecomm.types import ReduceOp, lookup_dtype

    b = TritonBackend(comm, "cpu", timeout=0.3)        # own epochs, pad and scratch
    d = lookup_dtype(torch.float32)
    x = torch.empty(16)

    def one():
        b.run(CollectiveCall("all_reduce", "one_shot", d, 16, {"buf": x}, op=ReduceOp.SUM))

    try:
        x.fill_(1.0)
        one()                                          # warm
        tape = record(b, one)
        x.fill_(float(comm.rank + 1))
        replay(tape)
        first = torch.equal(x, torch.full((16,), float(sum(range(1, comm.world_size + 1)))))
        comm.barrier()
        if comm.rank == 0:
            comm.barrier()
            return ("skipped", first)
        x.fill_(5.0)
        replay(tape)                                   # rank 0 does not take part
        epoch = b.ctx.device_epoch()
        try:
            b.synchronize()
            res = ("no error",)
        except tilecomm.CommTimeout as e:
            res = (type(e).__name__, e.rank, e.peer, e.epoch == epoch, str(e))
        comm.barrier()
        return res + (first,)
    finally:
        b.close()


# ---- pytest side -------------------------------------------------------------------------------

@pytest.mark.slow
def test_replayed_launches_synchronize_and_alternate_halves(rank_pool):
    for w in (2, 3):
        res = rank_pool(w, "interpreter").run(_replays)
        for r, out in enumerate(res):
            assert all(not v for v in out["bad"].values()), (w, r, out["bad"])
            kinds = set(out["kinds"])
            assert {"one_shot_all_reduce_kernel", "two_shot_all_reduce_kernel",
                    "all_gather_direct_kernel", "reduce_scatter_ring_kernel",
                    "direct_broadcast", "pairwise_all_to_all", "plan_kernel"} <= kinds, kinds
            calls = 9
            assert out["adds"] == calls and len(out["kinds"]) == calls, out
            # every replay advanced the device epochs by the calls in the graph
            assert out["dev"] == [out["host"] + calls * (i + 1) for i in range(REPLAYS)], out
            assert out["behind"] == (out["host"], out["host"]), out
            want = out["host"] + calls * (REPLAYS + 1)
            assert out["synced"] == (want, want), out
            # after warm-up the call path allocates, copies and synchronizes nothing on the
            # host side: what a CUDA graph capture needs (the same Python path as on CUDA)
            assert out["host_ops"] == {}, out["host_ops"]


def test_replay_without_a_peer_times_out(rank_pool):
    res = rank_pool(2, "interpreter").run_and_discard(_stale_replay_times_out)
    assert res[0] == ("skipped", True), res[0]
    name, rank, peer, same_epoch, msg, first = res[1]
    assert first and name == "DeviceTimeout", res[1]
    assert (rank, peer, same_epoch) == (1, 0, True), res[1]
    assert "CUDA graph replay" in msg and "epoch" in msg, msg

"""The generic plan kernel (``backends/triton/kernels/plan.py``) runs every registered schedule.

Each rank process runs the kernels in the Triton interpreter through the Communicator
(``comm.use_cpu_kernels("triton")``) with the fused kernels switched off
(``registry.FUSED = False``, as ``TILECOMM_GPU_FUSED=0``), so every call takes the plan
kernel. Every registered ``(collective, algo)`` at 2 and 3 ranks (and a few at 4), with roots
other than 0, odd sizes, count 0, all_to_all_v with uneven counts including zeros (counts
learned and given), several dtypes and every op; calls of different collectives run back to
back on the shared pad and scratch. Results are compared with numpy (integer-valued data:
exact in any order) and bit for bit with the CPU executor's answer to the same call.
"""

from __future__ import annotations

import time

import numpy as np
import pytest
import torch

import tilecomm

pytestmark = pytest.mark.interpreter

REDUCING = ("all_reduce", "reduce_scatter", "reduce")


# ---- rank side ---------------------------------------------------------------------------------

def set_fused(comm, fused):
    """Fused kernels on (True), off (False: every call takes the plan kernel) or as the
    setting says (None), for this rank process."""
    from tilecomm.backends.triton import registry
    registry.FUSED = fused
    be = comm._backends.get("cpu")
    specs = getattr(be, "_specs", None)      # the backend caches its lookups
    if isinstance(specs, dict):
        specs.clear()




def poison(n, dtype):
    if dtype.is_floating_point:
        return torch.full((n,), float("nan"), dtype=dtype)
    return torch.full((n,), -7 if dtype.is_signed else 77, dtype=dtype)


def in_len(coll, w, n):
    """Elements of a rank's input for the per-collective size ``n``."""
    return w * n if coll in ("reduce_scatter", "all_to_all") else n


def int_input(coll, w, r, n, k, dtype, op="sum"):
    """Rank r's integer-valued input of round k (exact in any dtype and summation order)."""
    base = torch.arange(in_len(coll, w, n), dtype=torch.float64)
    v = (base * (r + 1) + 3 * k + r) % 61 - 30
    if op == "prod":
        v = v % 3 - 1                      # {-1, 0, 1}: products stay exact
    if dtype in (torch.uint8,):
        v = v.abs()
    return v.to(dtype)


def v_rows(w, r, k):
    """all_to_all_v: rows rank r sends to each rank in round k (zeros included)."""
    return [(r * 3 + j * 2 + k) % 4 for j in range(w)]


def v_input(w, r, k, row, dtype):
    rows = sum(v_rows(w, r, k))
    base = torch.arange(rows * row, dtype=torch.float64)
    return ((base * (r + 2) + k) % 50 - 25).to(dtype).reshape(rows, row)


_NP = {"sum": np.sum, "avg": np.mean, "max": np.max, "min": np.min, "prod": np.prod}


def reference(coll, w, r, n, k, dtype, op="sum", root=0):
    """The expected output (float64 numpy) from every rank's regenerated input."""
    xs = np.stack([int_input(coll, w, q, n, k, dtype, op).double().numpy() for q in range(w)])
    if coll == "all_gather":
        return xs.reshape(-1)
    if coll == "broadcast":
        return xs[root]
    if coll == "all_to_all":
        return np.concatenate([xs[j][r * n:(r + 1) * n] for j in range(w)])
    red = _NP[op](xs, axis=0)
    if not dtype.is_floating_point and op == "avg":
        red = np.trunc(red)
    if coll == "reduce_scatter":
        return red[r * n:(r + 1) * n]
    if coll == "reduce":
        return red if r == root else xs[r]
    return red


def run_one(comm, coll, algo, x, op="sum", root=0, send=None, recv=None):
    """One Communicator call; returns the output tensor (a new tensor, inputs untouched)."""
    w = comm.world_size
    if coll == "all_reduce":
        y = x.clone()
        comm.all_reduce(y, op=op, algo=algo)
        return y
    if coll == "broadcast":
        y = x.clone()
        comm.broadcast(y, root, algo=algo)
        return y
    if coll == "reduce":
        y = x.clone()
        comm.reduce(y, root, op=op, algo=algo)
        return y
    if coll == "all_gather":
        return comm.all_gather(x, poison(w * x.numel(), x.dtype), algo=algo)
    if coll == "reduce_scatter":
        return comm.reduce_scatter(x, op=op, out=poison(x.numel() // w, x.dtype), algo=algo)
    if coll == "all_to_all":
        return comm.all_to_all(x, poison(x.numel(), x.dtype), algo=algo)
    if coll == "all_to_all_v":
        return comm.all_to_all_v(x, send, recv, algo=algo)
    raise KeyError(coll)


def executor(comm, fn, *args):
    """``fn(*args)`` on the CPU schedule executor instead of the kernels."""
    comm.use_cpu_kernels("executor")
    try:
        return fn(*args)
    finally:
        comm.use_cpu_kernels("triton")


def uses_plan(coll, algo, dtype, op):
    from tilecomm.backends.triton import registry
    from tilecomm.backends.triton.kernels.plan import launch_plan

    return registry.lookup(coll, algo, dtype, op).launch is launch_plan


def check_cases(comm, cases, with_executor=True):
    """Run ``cases`` [(coll, algo, n, dtype, op, root), ...] back to back (round k = index)
    through the plan kernel; returns the failures (empty: all exact). ``with_executor``: also
    compare with the CPU executor (switching to it and back makes a fresh kernel backend, so
    without it the calls share one pad, scratch and epoch sequence)."""
    w, r = comm.world_size, comm.rank
    bad = []
    for k, (coll, algo, n, dtype, op, root) in enumerate(cases):
        tag = f"{coll}/{algo} n={n} {dtype} {op} root={root}"
        red_op = op if coll in REDUCING else None
        if not uses_plan(coll, algo, dtype, red_op):
            bad.append(f"{tag}: not the plan kernel")
            continue
        x = int_input(coll, w, r, n, k, dtype, op)
        got = run_one(comm, coll, algo, x, op, root)
        want = reference(coll, w, r, n, k, dtype, op, root)
        if dtype.is_floating_point:        # avg: the exact quotient rounded once
            want = torch.from_numpy(want).to(dtype).double().numpy()
        ref = executor(comm, run_one, comm, coll, algo, x, op, root) if with_executor \
            else got                                                   # every rank, always
        if got.shape != (len(want),) or not np.array_equal(got.double().numpy(), want):
            bad.append(f"{tag}: {got.tolist()[:8]} != {want.tolist()[:8]}")
        elif not torch.equal(got, ref):
            bad.append(f"{tag}: differs from the CPU executor")
    return bad


def check_v(comm, algo, row, given, k):
    """all_to_all_v with uneven rows (zeros included), ``row`` elements per row, recv counts
    given or learned; vs numpy and the executor."""
    w, r = comm.world_size, comm.rank
    x = v_input(w, r, k, row, torch.float32)
    send = v_rows(w, r, k)
    recv = [v_rows(w, j, k)[r] for j in range(w)] if given else None
    got = run_one(comm, "all_to_all_v", algo, x, send=send, recv=recv)
    parts = []
    for j in range(w):
        xj, sj = v_input(w, j, k, row, torch.float32), v_rows(w, j, k)
        parts.append(xj[sum(sj[:r]):sum(sj[:r + 1])])
    want = torch.cat(parts)
    ref = executor(comm, run_one, comm, "all_to_all_v", algo, x, "sum", 0, send, recv)
    return (tuple(got.shape) == tuple(want.shape) and torch.equal(got, want)
            and torch.equal(got, ref))


def check_v_zero(comm, algo):
    """all_to_all_v where nothing moves at all."""
    w = comm.world_size
    got = run_one(comm, "all_to_all_v", algo, torch.zeros(0, 2), send=[0] * w, recv=[0] * w)
    return tuple(got.shape) == (0, 2)


def every_schedule(w, shift=0):
    """Every registered (collective, algo) but barrier, once, with ops, dtypes and roots
    varied across them (the index picks them), odd sizes."""
    from tilecomm.algorithms.registry import all_algorithms

    ops = ("sum", "avg", "max", "min", "prod")
    dtypes = (torch.float32, torch.int32, torch.float64, torch.bfloat16, torch.int64,
              torch.float16)
    cases = []
    for i, (coll, algo) in enumerate(all_algorithms()):
        if coll in ("barrier", "all_to_all_v"):
            continue
        n = (157, 37, 9, 130)[i % 4]
        dt = dtypes[(i + w + shift) % len(dtypes)]
        if coll in ("all_gather", "all_to_all", "broadcast") and i % 3 == 0:
            dt = (torch.uint8, torch.int8)[i % 2]
        op = ops[(i + w + shift) % len(ops)] if coll in REDUCING else "sum"
        if op == "avg" and not dt.is_floating_point:
            op = "sum"
        root = (w - 1 - (i + shift) % 2) if coll in ("broadcast", "reduce") else 0
        cases.append((coll, algo, n, dt, op, root))
    return cases


def plan_everything(comm):
    """The whole per-world-size suite on one rank group: every schedule, then a second round
    of every schedule with the other ops/roots, all_to_all_v, count 0."""
    from tilecomm.algorithms.registry import algorithms

    w = comm.world_size
    set_fused(comm, False)
    try:
        cases = every_schedule(w)
        # second round: fp32 avg, root 1, other sizes (what round one did not cover)
        cases += [(c, a, n + 1, torch.float32, "avg" if c in REDUCING else "sum",
                   1 if c in ("broadcast", "reduce") else 0) for c, a, n, _, _, _ in cases]
        # count 0 where the Communicator allows it
        cases += [("all_reduce", "ring", 0, torch.float32, "sum", 0),
                  ("all_reduce", "two_shot", 0, torch.float32, "sum", 0),
                  ("all_gather", "ring", 0, torch.float32, "sum", 0),
                  ("reduce", "tree", 0, torch.float32, "sum", w - 1)]
        bad = check_cases(comm, cases)
        v = [check_v(comm, a, row, given, k) for k, (a, row, given) in enumerate(
            [(a, row, given) for a in algorithms("all_to_all_v")
             for row, given in ((1, False), (3, True))])]
        z = [check_v_zero(comm, a) for a in algorithms("all_to_all_v")]
        # every schedule again, back to back on one backend (one pad, one scratch)
        bad += check_cases(comm, every_schedule(w, 1), with_executor=False)
        return bad, v, z
    finally:
        set_fused(comm, None)


def plan_four(comm):
    """A few schedules at 4 ranks (deeper trees, more ring/doubling steps, uneven v)."""
    set_fused(comm, False)
    try:
        bad = check_cases(comm, [
            ("all_reduce", "ring", 131, torch.float32, "sum", 0),
            ("all_reduce", "recursive_doubling", 131, torch.bfloat16, "max", 0),
            ("all_reduce", "rhd", 131, torch.float32, "sum", 0),
            ("all_reduce", "two_shot", 130, torch.int32, "sum", 0),
            ("reduce", "tree", 70, torch.float32, "sum", 2),
            ("broadcast", "tree", 70, torch.int64, "sum", 3),
            ("reduce_scatter", "ring", 33, torch.float16, "min", 0),
            ("all_gather", "ring", 33, torch.uint8, "sum", 0),
            ("all_to_all", "pairwise", 5, torch.float32, "sum", 0)])
        return bad, [check_v(comm, "pairwise", 2, False, 0), check_v(comm, "direct", 1, True, 1)]
    finally:
        set_fused(comm, None)


def mixed_fused_and_plan(comm):
    """Fused kernels and the plan kernel alternating on the same pad and scratch (each one's
    epochs, slots and scratch halves must leave the other's intact)."""
    bad = []
    seq = [("all_reduce", "one_shot", True), ("all_reduce", "ring", False),
           ("all_gather", "direct", True), ("all_gather", "direct", False),
           ("reduce_scatter", "ring", True), ("reduce_scatter", "direct", False),
           ("all_reduce", "two_shot", False), ("all_reduce", "two_shot", True)] * 2
    for k, (coll, algo, fused) in enumerate(seq):
        set_fused(comm, fused)
        bad += check_cases_any(comm, coll, algo, 77 + k, k)
    set_fused(comm, None)
    return bad


def check_cases_any(comm, coll, algo, n, k):
    w, r = comm.world_size, comm.rank
    x = int_input(coll, w, r, n, k, torch.float32)
    got = run_one(comm, coll, algo, x)
    want = reference(coll, w, r, n, k, torch.float32)
    return [] if np.array_equal(got.double().numpy(), want) else [f"{coll}/{algo} #{k}"]


def barrier_kernel(comm, delay):
    """The barrier schedule (no phases) through the plan kernel: rank 0 launches ``delay``
    seconds late; every other rank's launch must last until then (contract rule 2)."""
    from tilecomm.backends.base import CollectiveCall
    from tilecomm.backends.triton import registry
    from tilecomm.types import DTYPES

    be = comm._backends["cpu"]
    spec = registry.lookup("barrier", "direct", torch.float32, None, fused=False)
    comm.barrier()
    if comm.rank == 0:
        time.sleep(delay)
    be.ctx.begin(False)
    t = time.perf_counter()
    spec.launch(be.ctx, CollectiveCall("barrier", "direct", DTYPES[torch.float32], 0, {}))
    be.heap.check("barrier/direct")
    return time.perf_counter() - t


def silent_peer(comm, timeout):
    """Rank 0 never launches; rank 1's plan kernel must raise CommTimeout naming rank 0."""
    from tilecomm.backends.base import CollectiveCall
    from tilecomm.backends.triton import registry
    from tilecomm.types import DTYPES, ReduceOp

    be = comm._backends["cpu"]
    set_fused(comm, False)
    comm.all_reduce(torch.ones(64), algo="ring")          # scratch and pad exist everywhere
    be.heap.timeout = timeout
    if comm.rank == 0:
        return None
    call = CollectiveCall("all_reduce", "ring", DTYPES[torch.float32], 64,
                          {"buf": torch.ones(64)}, op=ReduceOp.SUM)
    be.ctx.begin(False)
    t = time.perf_counter()
    registry.lookup("all_reduce", "ring", torch.float32, "sum").launch(be.ctx, call)
    elapsed = time.perf_counter() - t
    try:
        be.heap.check("all_reduce/ring")
    except tilecomm.CommTimeout as e:
        return type(e).__name__, e.rank, e.peer, str(e), elapsed
    return "no error"


def lookups(comm):
    """What the registry answers, fused on and off."""
    from tilecomm.algorithms.registry import algorithms
    from tilecomm.backends.triton import registry
    from tilecomm.backends.triton.kernels.plan import launch_plan

    be = comm._backends["cpu"]
    out = {}
    for coll in ("all_reduce", "all_gather", "reduce", "broadcast", "all_to_all_v"):
        out[coll] = be.algorithms(coll) == algorithms(coll)
    fused = registry.lookup("all_reduce", "one_shot", torch.float32, "sum", fused=True)
    plan = registry.lookup("all_reduce", "one_shot", torch.float32, "sum", fused=False)
    ring = registry.lookup("all_reduce", "ring", torch.float32, "sum", fused=True)
    byte = registry.lookup("all_gather", "direct", torch.uint8, None, fused=True)
    errs = []
    for args in (("all_reduce", "ring", torch.uint8, "sum"),
                 ("all_reduce", "nope", torch.float32, "sum")):
        try:
            registry.lookup(*args)
            errs.append("no error")
        except (TypeError, ValueError) as e:
            errs.append(f"{type(e).__name__}: {e}")
    return (out, fused.launch is not launch_plan, plan.launch is launch_plan,
            ring.launch is launch_plan, byte.launch is launch_plan, errs)


# ---- pools -------------------------------------------------------------------------------------

# ---- tests -------------------------------------------------------------------------------------

@pytest.mark.slow
@pytest.mark.parametrize("w", [2, 3])
def test_every_schedule_through_the_plan_kernel(w, rank_pool):
    res = rank_pool(w, "kernels").run(plan_everything)
    for r, (bad, v, z) in enumerate(res):
        assert bad == [], f"rank {r}: " + "\n".join(bad)
        assert all(v), f"rank {r}: all_to_all_v {v}"
        assert all(z), f"rank {r}: empty all_to_all_v {z}"


def test_four_ranks(rank_pool):
    for r, (bad, v) in enumerate(rank_pool(4, "kernels").run(plan_four)):
        assert bad == [], f"rank {r}: " + "\n".join(bad)
        assert all(v), f"rank {r}: all_to_all_v {v}"


def test_fused_and_plan_kernels_back_to_back(rank_pool):
    for r, bad in enumerate(rank_pool(3, "kernels").run(mixed_fused_and_plan)):
        assert bad == [], f"rank {r}: {bad}"


def test_registry_offers_every_schedule(rank_pool):
    got = rank_pool(2, "kernels").run(lookups)[0]
    out, fused_fast, plan_when_off, ring_plan, byte_plan, errs = got
    assert all(out.values()), out
    assert fused_fast and plan_when_off and ring_plan and byte_plan
    assert errs[0].startswith("TypeError") and "uint8" in errs[0] and "float32" in errs[0]
    assert errs[1].startswith("ValueError") and "ring" in errs[1] and "two_shot" in errs[1]


def test_barrier_schedule_waits_for_every_rank(rank_pool):
    took = rank_pool(3, "kernels").run(barrier_kernel, 0.6)
    assert all(t >= 0.45 for t in took[1:]), took


def test_silent_peer_raises_commtimeout(rank_pool):
    res = rank_pool(2, "kernels").run_and_discard(silent_peer, 0.3)
    assert res[0] is None
    name, rank, peer, msg, elapsed = res[1]
    assert (name, rank, peer) == ("DeviceTimeout", 1, 0), res[1]
    assert "all_reduce/ring" in msg and 0.3 <= elapsed < 15, msg


def _mask_limit(comm):
    import types

    from tilecomm.backends.triton import TritonBackend
    from tilecomm.types import ReduceOp

    big, ok = types.SimpleNamespace(world_size=64), types.SimpleNamespace(world_size=63)
    out = []
    for who, algo in ((big, "ring"), (ok, "ring"), (big, "one_shot")):
        try:
            TritonBackend.check(who, "all_reduce", algo, torch.float32, ReduceOp.SUM)
            out.append("ok")
        except ValueError as e:
            out.append(str(e))
    return out


def test_plan_kernel_refuses_more_ranks_than_its_masks_hold(rank_pool):
    """Waits travel as int64 rank masks: beyond 63 ranks the plan kernel is refused with a
    clear error at check time (on every rank alike), while fused kernels stay available.
    (In the ranks: looking kernels up imports them, which must happen under the interpreter.)"""
    for res in rank_pool(2, "kernels").run(_mask_limit):
        assert "at most 63 ranks" in res[0] and res[1:] == ["ok", "ok"], res

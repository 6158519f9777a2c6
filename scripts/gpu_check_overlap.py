"""The fused ops' part of scripts/gpu_check.py: tilecomm.ops.all_gather_matmul (both ``copy``
variants) and matmul_reduce_scatter on the check's ranks, judged against the references and
timed against the unfused ``torch.matmul`` + tilecomm collective and, where the installed
torch has them and they run, PyTorch's fused symmetric-memory ops
(``torch.ops.symm_mem.fused_all_gather_matmul`` / ``fused_matmul_reduce_scatter``).

Rank side only: :func:`overlap_checks` runs inside gpu_check's rank task (``rk`` is its
``_Rank``: ``gather``, ``agree``, ``sync``, ``realign``, ``_judged``, ``log``, ``cfg``).

Correctness rows (``kernel`` = ``ops/<op>[/<copy>]``): every rank's inputs from seeds, the
result against ``tilecomm.ops`` references with a tolerance (the kernels' ``tl.dot`` adds K in
another order than torch's BLAS), the gathered A exactly. Timing rows (``res["overlap"]``):
per case the slowest rank's median over rounds of ``iters`` back-to-back calls (host clock
around a device synchronization; the ops' host handshake is part of their cost), ratio
unfused / fused. A PyTorch baseline that is missing or fails is reported with its reason and
never fails the check (it is not the code under test).
"""

from __future__ import annotations

import gc
import statistics
import time

#: tolerance of the kernels against the references, ``|got - want| <= atol + rtol * |want|``:
#: another K order moves a 16-bit result by about one rounding of the output (and of each
#: partial of the reduce-scatter)
TOL = {"float32": (1e-3, 1e-4), "bfloat16": (0.05, 2e-2), "float16": (0.01, 4e-3)}


def _inputs(torch, w, r, m, k, n, dtype, dev, seed):
    """Every rank's shard / slice (seeded), this rank's on ``dev``."""
    def rand(shape, s):
        return torch.randn(*shape, generator=torch.Generator().manual_seed(s)).to(dtype)
    shards = [rand((m, k), seed + 10 * s) for s in range(w)]
    b_ag = rand((k, n), seed + 7)
    a_rs = [rand((w * m, k), seed + 10 * s + 3) for s in range(w)]
    b_rs = [rand((k, n), seed + 10 * s + 5) for s in range(w)]
    return shards, b_ag, a_rs, b_rs


def correctness(rk, deadline):
    """Rows for both ops (and both copy variants) at the configured shapes and dtypes."""
    import torch

    from tilecomm.ops import (all_gather_matmul, all_gather_matmul_reference,
                              matmul_reduce_scatter, matmul_reduce_scatter_reference)
    w, r, dev = rk.w, rk.r, rk.dev
    rows = []
    for (m, k, n) in rk.cfg["overlap_check_shapes"]:
        for dt in rk.cfg["overlap_dtypes"]:
            dtype = getattr(torch, dt)
            for kind in ("all_gather_matmul/kernel", "all_gather_matmul/stream",
                         "matmul_reduce_scatter"):
                op = kind.split("/")[0]
                rec = dict(case=f"ops/{kind}/{dt}/m{m}k{k}n{n}/w{w}", kernel=f"ops/{kind}",
                           world=w, dtype=dt, redop="sum", mem="user", engine="ops")
                if not rk.agree(time.time() < deadline):
                    rows.append(dict(rec, ok=None, error="skipped: world budget spent"))
                    continue
                seed = 300 + len(rows)
                detail = {}

                def fn(op=op, kind=kind, dtype=dtype, dt=dt, seed=seed, detail=detail,
                       m=m, k=k, n=n):
                    shards, b, a_rs, b_rs = _inputs(torch, w, r, m, k, n, dtype, dev, seed)
                    if op == "all_gather_matmul":
                        want, gwant = all_gather_matmul_reference(shards, b)
                        got, g = all_gather_matmul(shards[r].to(dev), b.to(dev), rk.comm,
                                                   return_gathered=True,
                                                   copy=kind.split("/")[1])
                        rk.sync()
                        if not torch.equal(g.cpu(), gwant):
                            detail["gathered"] = "gathered A differs"
                            return int((g.cpu() != gwant).sum())
                    else:
                        want = matmul_reduce_scatter_reference(a_rs, b_rs)[r]
                        got = matmul_reduce_scatter(a_rs[r].to(dev), b_rs[r].to(dev), rk.comm)
                        rk.sync()
                    diff = (got.cpu().float() - want.float()).abs()
                    detail["max_abs_diff"] = float(diff.max()) if diff.numel() else 0.0
                    atol, rtol = TOL[dt]
                    return int((diff > atol + rtol * want.float().abs()).sum())
                rec = rk._judged(rec, fn)
                rec.update(detail)
                gc.collect()
                rows.append(rec)
                rk.log(dict(phase="check", **rec))
    return rows


def _torch_symm(torch, rk):
    """``(fused_all_gather_matmul, fused_matmul_reduce_scatter, group_name)`` of PyTorch's
    symmetric-memory ops on a process group of the check's ranks, or a reason string."""
    if rk.dev.type != "cuda":
        return "n/a: PyTorch's symmetric memory needs CUDA tensors (interpret mode)"
    ops = getattr(torch.ops, "symm_mem", None)
    if ops is None or not hasattr(ops, "fused_all_gather_matmul") \
            or not hasattr(ops, "fused_matmul_reduce_scatter"):
        return f"n/a: torch {torch.__version__} has no torch.ops.symm_mem fused ops"
    try:
        import torch.distributed as dist
        from torch.distributed import _symmetric_memory as symm
        if not dist.is_initialized():
            path = rk.cfg["overlap_store"] + f".w{rk.w}"
            store = dist.FileStore(path, rk.w)
            dist.init_process_group("nccl", store=store, rank=rk.r, world_size=rk.w,
                                    device_id=rk.dev)
        name = dist.group.WORLD.group_name
        if hasattr(symm, "enable_symm_mem_for_group"):
            symm.enable_symm_mem_for_group(name)
    except Exception as e:  # noqa: BLE001 - reported as the baseline's reason
        return f"unavailable: {type(e).__name__}: {str(e)[:300]}"
    return ops.fused_all_gather_matmul, ops.fused_matmul_reduce_scatter, name


def _time(rk, fn, iters, rounds):
    """Seconds per call of every round (after one warm-up call), on this rank."""
    fn()
    rk.sync()
    out = []
    for _ in range(rounds):
        rk.comm.barrier()
        t0 = time.perf_counter()
        for _ in range(iters):
            fn()
        rk.sync()
        out.append((time.perf_counter() - t0) / iters)
    return out


def timing(rk, deadline):
    """Timing rows: fused (both copy variants) vs unfused vs PyTorch's fused ops."""
    import torch

    from tilecomm.ops import all_gather_matmul, matmul_reduce_scatter
    comm, w, r, dev = rk.comm, rk.w, rk.r, rk.dev
    iters, rounds = rk.cfg["overlap_iters"], rk.cfg["overlap_rounds"]
    symm = _torch_symm(torch, rk)
    # every rank must agree on whether the baseline runs (it is collective)
    have = all(x[0] for x in rk.gather([int(not isinstance(symm, str))]))
    if not have and not isinstance(symm, str):
        symm = "unavailable on another rank"
    rows = []
    for (m, k, n) in rk.cfg["overlap_time_shapes"]:
        dt = rk.cfg["overlap_time_dtype"]
        dtype = getattr(torch, dt)
        g = torch.Generator().manual_seed(r)
        a = torch.randn(m, k, generator=g).to(dtype).to(dev)
        b = torch.randn(k, n, generator=g).to(dtype).to(dev)
        a_rs = torch.randn(w * m, k, generator=g).to(dtype).to(dev)
        cands = {
            "all_gather_matmul": [
                ("fused copy=kernel", lambda: all_gather_matmul(a, b, comm, copy="kernel")),
                ("fused copy=stream", lambda: all_gather_matmul(a, b, comm, copy="stream")),
                ("unfused all_gather + matmul", lambda: torch.matmul(comm.all_gather(a), b))],
            "matmul_reduce_scatter": [
                ("fused", lambda: matmul_reduce_scatter(a_rs, b, comm)),
                ("unfused matmul + reduce_scatter",
                 lambda: comm.reduce_scatter(torch.matmul(a_rs, b)))],
        }
        if not isinstance(symm, str):
            ag, rs, name = symm
            cands["all_gather_matmul"].append(
                ("torch symm_mem fused", lambda: ag(a, [b], 0, name)))
            cands["matmul_reduce_scatter"].append(
                ("torch symm_mem fused", lambda: rs(a_rs, b, "sum", 0, name)))
        for op, fns in cands.items():
            row = dict(case=f"ops/{op}/{dt}/m{m}k{k}n{n}/w{w}", op=op, world=w, dtype=dt,
                       m=m, k=k, n=n, us={}, errors={})
            if isinstance(symm, str):
                row["errors"]["torch symm_mem fused"] = symm
            for label, fn in fns:
                if not rk.agree(time.time() < deadline):
                    row["errors"][label] = "skipped: world budget spent"
                    continue
                secs, err = None, None
                try:
                    secs = _time(rk, fn, iters, rounds)
                except Exception as e:  # noqa: BLE001 - reported
                    err = f"{type(e).__name__}: {str(e)[:300]}"
                alls = rk.gather([int(x * 1e9) for x in secs] if secs else [-1] * rounds)
                if any(x[0] < 0 for x in alls):
                    rk.realign()
                    row["errors"][label] = err or "failed on another rank"
                    continue
                per_round = [max(x[i] for x in alls) / 1e9 for i in range(rounds)]
                row["us"][label] = statistics.median(per_round) * 1e6
                gc.collect()
            base = [v for lab, v in row["us"].items() if lab.startswith("unfused")]
            if base:
                row["unfused_over"] = {lab: base[0] / v for lab, v in row["us"].items()
                                       if not lab.startswith("unfused")}
            fused = {lab: v for lab, v in row["us"].items() if lab.startswith("fused")}
            if len(fused) > 1:
                row["faster_copy"] = min(fused, key=fused.get)
            rows.append(row)
            rk.log(dict(phase="overlap", **row))
        del a, b, a_rs
        gc.collect()
    return rows


def overlap_checks(rk, deadline):
    """``(correctness rows, timing rows)`` of the fused ops for this world."""
    t0 = time.time()
    checks = correctness(rk, t0 + 0.5 * (deadline - t0))
    return checks, timing(rk, deadline)


def text_lines(rows) -> list[str]:
    """The report's section of the timing rows."""
    if not rows:
        return []
    lines = ["", "fused ops (us per call, slowest rank, median round; unfused/x > 1: x is "
                 "faster than unfused):"]
    for t in rows:
        cells = "  ".join(f"{lab}: {us:.1f}" + (f" ({t['unfused_over'][lab]:.2f}x)"
                                               if lab in t.get("unfused_over", {}) else "")
                          for lab, us in t["us"].items())
        lines.append(f"  {t['case']:44s} {cells}")
        if t.get("faster_copy"):
            lines.append(f"  {'':44s} faster all-gather copy: {t['faster_copy']}")
        for lab, e in t["errors"].items():
            lines.append(f"  {'':44s} {lab}: {e}")
    return lines

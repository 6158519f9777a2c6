"""Phase ``overlap``: the fused ops (``tilecomm.ops.all_gather_matmul`` with ``copy="kernel"``
and ``copy="stream"``, ``matmul_reduce_scatter``), checked against their references, then
timed against the unfused layer (``torch.matmul`` + NCCL all_gather / reduce_scatter where
NCCL runs on this GPU, and + tilecomm's own collective) and PyTorch's fused
symmetric-memory ops where the installed torch has them.

Checks (``kernel`` = ``ops/<op>[/<copy>]``): every rank's inputs from seeds, the result against
the references with a tolerance (the kernels' ``tl.dot`` adds K in another order than torch's
BLAS), the gathered A exactly. Timings: per case the slowest rank's median over rounds of
``iters`` back-to-back calls (host clock around a device synchronization: the ops' host
handshake is part of their cost); ``speedup`` = unfused (NCCL where it ran) / fused, and
``faster_copy`` names the copy variant that won, which is how the default is chosen.
"""

from __future__ import annotations

import gc
import time

import torch

from .rank import checks_then_timings

#: tolerance of the kernels against the references, ``|got - want| <= atol + rtol * |want|``:
#: another K order moves a 16-bit result by about one rounding of the output (and of each
#: partial of the reduce-scatter)
TOL = {"float32": (1e-3, 1e-4), "bfloat16": (0.05, 2e-2), "float16": (0.01, 4e-3)}
KINDS = ("all_gather_matmul/kernel", "all_gather_matmul/stream", "matmul_reduce_scatter")


def _inputs(w, m, k, n, dtype, seed):
    """Every rank's shard / slice (seeded)."""
    def rand(shape, s):
        return torch.randn(*shape, generator=torch.Generator().manual_seed(s)).to(dtype)
    shards = [rand((m, k), seed + 10 * s) for s in range(w)]
    b_ag = rand((k, n), seed + 7)
    a_rs = [rand((w * m, k), seed + 10 * s + 3) for s in range(w)]
    b_rs = [rand((k, n), seed + 10 * s + 5) for s in range(w)]
    return shards, b_ag, a_rs, b_rs


def checks(rk, deadline: float) -> list[dict]:
    from ...ops import (all_gather_matmul, all_gather_matmul_reference, matmul_reduce_scatter,
                        matmul_reduce_scatter_reference)
    w, r, dev = rk.w, rk.r, rk.dev
    rows = []
    for (m, k, n) in rk.cfg["overlap_check_shapes"]:
        for dt in rk.cfg["overlap_dtypes"]:
            dtype = getattr(torch, dt)
            for kind in KINDS:
                op = kind.split("/")[0]
                rec = dict(phase="overlap", case=f"ops/{kind}/{dt}/m{m}k{k}n{n}/w{w}",
                           kernel=f"ops/{kind}", world=w, dtype=dt, redop="sum", mem="user",
                           engine="ops")
                if not rk.in_time(deadline):
                    rows.append(rk.skipped(rec))
                    continue
                seed = 300 + len(rows)
                detail: dict = {}

                def fn(op=op, kind=kind, dtype=dtype, dt=dt, seed=seed, detail=detail,
                       m=m, k=k, n=n):
                    shards, b, a_rs, b_rs = _inputs(w, m, k, n, dtype, seed)
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
                rec = rk.judged(rec, fn)
                rec.update(detail)
                rows.append(rec)
                rk.log(rec)
    return rows


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


def _torch_fused(rk):
    """``(fused_all_gather_matmul, fused_matmul_reduce_scatter, group name)`` or a reason."""
    base = rk.baselines()
    if base.symm_group is None:
        return base.symm_reason
    ops = torch.ops.symm_mem
    if not hasattr(ops, "fused_all_gather_matmul") or \
            not hasattr(ops, "fused_matmul_reduce_scatter"):
        return f"n/a: torch {torch.__version__} has no torch.ops.symm_mem fused ops"
    return ops.fused_all_gather_matmul, ops.fused_matmul_reduce_scatter, base.symm_group


def timings(rk, deadline: float) -> list[dict]:
    from ...ops import all_gather_matmul, matmul_reduce_scatter
    comm, w, r, dev = rk.comm, rk.w, rk.r, rk.dev
    iters, rounds = rk.cfg["overlap_iters"], rk.cfg["overlap_rounds"]
    base = rk.baselines()
    symm = _torch_fused(rk)
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
                ("unfused tilecomm all_gather + matmul",
                 lambda: torch.matmul(comm.all_gather(a), b))],
            "matmul_reduce_scatter": [
                ("fused", lambda: matmul_reduce_scatter(a_rs, b, comm)),
                ("unfused matmul + tilecomm reduce_scatter",
                 lambda: comm.reduce_scatter(torch.matmul(a_rs, b)))],
        }
        reasons = {}
        if base.nccl is not None:
            dist, grp = base.dist, base.nccl
            ag_out = torch.empty(w * m, k, dtype=dtype, device=dev)
            rs_out = torch.empty(m, n, dtype=dtype, device=dev)

            def ag_nccl():
                dist.all_gather_into_tensor(ag_out, a, group=grp)
                return torch.matmul(ag_out, b)

            def rs_nccl():
                dist.reduce_scatter_tensor(rs_out, torch.matmul(a_rs, b), group=grp)
                return rs_out
            cands["all_gather_matmul"].append(("unfused nccl all_gather + matmul", ag_nccl))
            cands["matmul_reduce_scatter"].append(("unfused matmul + nccl reduce_scatter",
                                                   rs_nccl))
        else:
            reasons["unfused nccl"] = base.nccl_reason
        if not isinstance(symm, str):
            ag, rs, name = symm
            cands["all_gather_matmul"].append(
                ("torch symm_mem fused", lambda: ag(a, [b], 0, name)))
            cands["matmul_reduce_scatter"].append(
                ("torch symm_mem fused", lambda: rs(a_rs, b, "sum", 0, name)))
        else:
            reasons["torch symm_mem fused"] = symm
        for op, fns in cands.items():
            row = dict(phase="overlap", case=f"ops/{op}/{dt}/m{m}k{k}n{n}/w{w}", op=op,
                       world=w, dtype=dt, m=m, k=k, n=n, us={}, errors=dict(reasons))
            for label, fn in fns:
                if not rk.in_time(deadline):
                    row["errors"][label] = "skipped: phase budget spent"
                    continue
                rk.timed_into(row, label, lambda fn=fn: _time(rk, fn, iters, rounds), rounds)
                gc.collect()
            unfused = [v for lab, v in row["us"].items() if lab.startswith("unfused nccl")
                       or lab.startswith("unfused matmul + nccl")] or \
                [v for lab, v in row["us"].items() if lab.startswith("unfused")]
            if unfused:
                row["speedup"] = {lab: unfused[0] / v for lab, v in row["us"].items()
                                  if not lab.startswith("unfused")}
            fused = {lab: v for lab, v in row["us"].items() if lab.startswith("fused")}
            if len(fused) > 1:
                row["faster_copy"] = min(fused, key=fused.get)
            rows.append(row)
            rk.log(row)
        cands = None            # the closures hold this shape's tensors
        gc.collect()
    return rows


def run(rk, deadline: float) -> list[dict]:
    return checks_then_timings(rk, deadline, checks, timings, 0.5)



def text_lines(rows) -> list[str]:
    """The report's section of the timing rows."""
    rows = [t for t in rows if "us" in t]
    if not rows:
        return []
    lines = ["", "fused ops (us per call, slowest rank, median round; (x): unfused / this, "
                 "> 1 is faster than unfused):"]
    for t in rows:
        cells = "  ".join(f"{lab}: {us:.1f}" + (f" ({t['speedup'][lab]:.2f}x)"
                                               if lab in t.get("speedup", {}) else "")
                          for lab, us in t["us"].items())
        lines.append(f"  {t['case']:44s} {cells}")
        if t.get("faster_copy"):
            lines.append(f"  {'':44s} faster all-gather copy: {t['faster_copy']}")
        for lab, e in t["errors"].items():
            lines.append(f"  {'':44s} {lab}: {e}")
    return lines


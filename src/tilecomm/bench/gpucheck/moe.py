"""Phase ``moe``: MoE dispatch/combine on the kernel engine (``tilecomm.moe``), checked bit for
bit against ``tilecomm.moe.reference``, then timed against the layer users write without such
a library: permute the rows by destination, exchange the counts, ``all_to_all_single`` on NCCL
(same ranks, same GPU) and an ``index_add_`` per token (``bench.moe.permuted_dispatch`` /
``permuted_combine``, on CUDA tensors).

Checks: normal mode (bf16, f32, f16, fp8; an empty rank; growth; back to back) and
low-latency mode, each against the reference of every rank's seeded inputs, every field of
the result and the combined output; a decode step in low-latency mode captured in a CUDA graph
and replayed on new inputs (GPU only). The "experts" are a deterministic function of each row
(expert ``e`` scales by ``e + 1`` and adds the local rank), so a wrong row, weight or order
shows in the bits.

Timings (slowest rank, median of rounds, each phase between a barrier and a device
synchronization): dispatch and combine of ``tokens`` tokens per rank (normal mode, bf16 and
fp8) and of a decode batch (low-latency mode), against the NCCL layer, and the device copy of
the received bytes as the bound.
"""

from __future__ import annotations

import statistics
import time

import torch

from ...moe import ExpertParallel, reference as R
from ...moe.synthetic import expert_output, inputs, normal_rows, reference_combined
from .rank import checks_then_timings


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.detach().cpu().contiguous().view(torch.uint8)


def cases(kind: str, w: int) -> list[tuple]:
    """``(tokens per rank, hidden, experts, topk, dtype, fp8, mode)`` rows."""
    if kind == "interpret":
        return [([5, 0, 4, 3][:w], 32, 2 * w, 3, "bfloat16", False, "normal"),
                ([3, 6, 2, 1][:w], 128, 2 * w, 2, "bfloat16", True, "normal"),
                ([4, 4, 1, 2][:w], 17, 2 * w, 2, "float32", False, "low_latency")]
    big = [96] * w
    big[-1] = 0
    return [(big, 7168, 8 * w, 8, "bfloat16", False, "normal"),
            ([64] * w, 7168, 8 * w, 8, "bfloat16", False, "normal"),   # back to back
            ([33 + r for r in range(w)], 1001, 4 * w, 4, "float32", False, "normal"),
            ([20] * w, 33, 2 * w, 2, "float16", False, "normal"),
            ([48] * w, 7168, 8 * w, 8, "bfloat16", True, "normal"),
            ([40] * w, 2048, 4 * w, 4, "bfloat16", False, "low_latency"),
            ([40] * w, 2048, 4 * w, 4, "bfloat16", True, "low_latency"),
            ([200] * w, 7168, 8 * w, 8, "bfloat16", False, "normal")]   # grows


def _mismatches(rk, ep, case, seed) -> list[str]:
    """One dispatch + combine of ``case`` on the device; the fields that differ from the
    reference (empty: bit for bit)."""
    tokens, h, e, k, dt, fp8, mode = case
    dtype = getattr(torch, dt)
    w, r = rk.w, rk.r
    ins = [inputs(q, tokens[q], h=h, k=k, e=e, dtype=dtype, seed=seed) for q in range(w)]
    x, idx, wts = (v.to(rk.dev) for v in ins[r])
    m = max(tokens)
    if mode == "low_latency":
        d = ep.dispatch(x, idx, wts, mode="low_latency", max_tokens_per_rank=m, fp8=fp8)
        xs = d.dequantized(dtype) if fp8 else d.x
        y = torch.zeros_like(xs)
        for le in range(ep.el):       # every slot: the reference only reads valid ones
            y[le] = expert_output(xs[le], torch.full((xs.shape[1],), le, device=xs.device), r)
        out = ep.combine(y, d)
    else:
        d = ep.dispatch(x, idx, wts, fp8=fp8)
        out = ep.combine(normal_rows(d, r, dtype), d)
    rk.sync()
    ref = R.dispatch([i[0] for i in ins], [i[1] for i in ins], [i[2] for i in ins], e, fp8=fp8)
    bad = []
    if mode == "normal":
        for key in ("x", "src_rank", "src_token", "topk_idx", "topk_weights",
                    "tokens_per_expert") + (("scales",) if fp8 else ()):
            if not torch.equal(_bits(getattr(d, key)), _bits(ref[r][key])):
                bad.append(key)
    else:
        want = R.low_latency(ref[r], w, ep.el, m)
        if not torch.equal(d.count.cpu(), want["count"]):
            bad.append("count")
        got_x = d.x.cpu()
        src, loc = ref[r]["src_rank"], ref[r]["topk_idx"]
        for le in range(ep.el):
            for s in range(w):
                n = int(((src == s)[:, None] & (loc == le)).sum())   # rows le got from s
                sl = slice(s * m, s * m + n)
                if not torch.equal(_bits(got_x[le, sl]), _bits(want["x"][le, sl])):
                    bad.append(f"x[{le}, from {s}]")
    outs = reference_combined(ref, tokens, dtype, fp8)
    if not torch.equal(_bits(out), _bits(outs[r])):
        bad.append("combined output")
    return bad


def graph_case(rk) -> dict:
    """A low-latency decode step (dispatch, experts, combine) captured in one CUDA graph and
    replayed on new inputs copied into the captured tensors: each replay must give the
    reference's combined output (NOTE [low latency on the device])."""
    h, e, k, t = 2048, 4 * rk.w, 4, 32
    rec = dict(phase="moe", case=f"moe/w{rk.w}/bfloat16/h{h}/e{e}/k{k}/t{t}/low_latency/"
                                 f"cuda_graph", kernel="moe/low_latency/graph", world=rk.w)
    if not rk.cuda:
        return dict(rec, ok=None, applicable=False, error="n/a: CUDA graphs need a GPU")
    ep = ExpertParallel(rk.comm, num_experts=e, hidden=h, dtype=torch.bfloat16)
    x, idx, w = (v.to(rk.dev) for v in inputs(rk.r, t, h=h, k=k, e=e, seed=50))

    def step():
        d = ep.dispatch(x, idx, w, mode="low_latency", max_tokens_per_rank=t)
        y = torch.stack([expert_output(d.x[le], torch.full((d.x.shape[1],), le,
                                                            device=rk.dev), rk.r)
                         for le in range(ep.el)])
        return ep.combine(y, d)

    def fn():
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(2):            # eager: the first call agrees on M with the peers
                step()
        torch.cuda.current_stream().wait_stream(side)
        rk.sync()
        rk.comm.barrier()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, capture_error_mode="thread_local"):
            out = step()
        wrong = 0
        for i in range(3):
            ins = [inputs(q, t, h=h, k=k, e=e, seed=60 + i) for q in range(rk.w)]
            x.copy_(ins[rk.r][0])
            idx.copy_(ins[rk.r][1])
            w.copy_(ins[rk.r][2])
            graph.replay()
            rk.sync()
            ref = R.dispatch([a[0] for a in ins], [a[1] for a in ins], [a[2] for a in ins], e)
            ys = [R.weighted(lambda i_, j, d=ref[q], q=q: expert_output(
                d["x"][i_:i_ + 1], d["topk_idx"][i_, j:j + 1], q)[0], ref[q], torch.bfloat16)
                for q in range(rk.w)]
            want = R.combine(ys, ref, [t] * rk.w, torch.bfloat16)[rk.r]
            wrong += int((_bits(out) != _bits(want)).sum())
        return wrong
    return rk.judged(rec, fn)


def checks(rk, deadline: float) -> list[dict]:
    out, layers = [], {}
    for i, case in enumerate(cases(rk.cfg["moe_cases"], rk.w)):
        tokens, h, e, k, dt, fp8, mode = case
        rec = dict(phase="moe", case=f"moe/w{rk.w}/{dt}/h{h}/e{e}/k{k}/t{tokens}/"
                                     f"{'fp8/' if fp8 else ''}{mode}",
                   kernel=f"moe/{mode}", world=rk.w, dtype=dt)
        if not rk.in_time(deadline):
            out.append(rk.skipped(rec))
            continue
        key = (h, e, dt)
        if key not in layers:
            layers[key] = ExpertParallel(rk.comm, num_experts=e, hidden=h,
                                         dtype=getattr(torch, dt))
        detail: list[str] = []

        def fn(case=case, i=i, detail=detail):
            detail += _mismatches(rk, layers[key], case, seed=i)
            return len(detail)
        rec = rk.judged(rec, fn)
        if detail:
            rec["error"] = f"differs from the reference: {', '.join(detail[:6])}"
        out.append(rec)
        rk.log(rec)
    if rk.in_time(deadline):
        rec = graph_case(rk)
        out.append(rec)
        rk.log(rec)
    return out


# ---- timings --------------------------------------------------------------------------------
def _phase_time(rk, fn) -> float:
    rk.comm.barrier()
    t0 = time.perf_counter()
    res = fn()
    rk.sync()
    return res, time.perf_counter() - t0


def timings(rk, deadline: float) -> list[dict]:
    from ..moe import a2a_single, permuted_combine, permuted_dispatch, received_rows
    cfg = rk.cfg
    iters = max(1, cfg["moe_iters"])
    base = rk.baselines()
    big = cfg["moe_cases"] != "interpret"
    h, k = (7168, 8) if big else (128, 2)      # fp8: a scale per 128 channels
    e = 8 * rk.w
    shapes = [(512 if big else 8, "normal", False), (512 if big else 8, "normal", True),
              (128 if big else 4, "low_latency", False), (128 if big else 4, "low_latency", True)]
    rows = []
    ep = ExpertParallel(rk.comm, num_experts=e, hidden=h, dtype=torch.bfloat16)
    for t, mode, fp8 in shapes:
        rec = dict(phase="moe", case=f"moe/time/w{rk.w}/bfloat16/h{h}/e{e}/k{k}/t{t}/"
                                     f"{'fp8/' if fp8 else ''}{mode}", world=rk.w,
                   tokens=t, hidden=h, experts=e, topk=k, mode=mode, fp8=fp8,
                   ms={}, errors={})
        if not rk.in_time(deadline):
            rec["errors"]["tilecomm"] = "skipped: phase budget spent"
            rows.append(rec)
            continue
        x, idx, w = (v.to(rk.dev) for v in inputs(rk.r, t, h=h, k=k, e=e, seed=99, drop=0.0))
        kw = dict(mode="low_latency", max_tokens_per_rank=t) if mode == "low_latency" else {}
        err, res = None, {}
        try:
            for _ in range(2):                     # warm: buffers grow, kernels compile
                d = ep.dispatch(x, idx, w, fp8=fp8, **kw)
                ep.combine(d.dequantized(x.dtype) if fp8 else d.x, d)
            disp, comb = [], []
            for _ in range(iters):
                d, td = _phase_time(rk, lambda: ep.dispatch(x, idx, w, fp8=fp8, **kw))
                y = d.dequantized(x.dtype) if fp8 else d.x
                _, tc = _phase_time(rk, lambda: ep.combine(y, d))
                disp.append(td)
                comb.append(tc)
            rows_got = int(d.count.sum()) if mode == "low_latency" else d.x.shape[0]
            res = dict(dispatch=statistics.median(disp), combine=statistics.median(comb),
                       rows=rows_got)
            buf = torch.empty_like(y)              # the bound: one device copy of the rows
            _, tcp = _phase_time(rk, lambda: buf.copy_(y))
            _, tcp = _phase_time(rk, lambda: buf.copy_(y))
            res["copy"] = tcp
        except Exception as ex:  # noqa: BLE001
            err = f"{type(ex).__name__}: {str(ex)[:300]}"
        per = rk.gather([int(res.get(q, -1e-9) * 1e9) for q in ("dispatch", "combine", "copy")])
        if any(v < 0 for p in per for v in p):
            rec["errors"]["tilecomm"] = rk.failed_elsewhere(err)
            rk.recover()
            rows.append(rec)
            continue
        rec["ms"]["tilecomm dispatch"] = max(p[0] for p in per) / 1e6
        rec["ms"]["tilecomm combine"] = max(p[1] for p in per) / 1e6
        rec["ms"]["device copy of the rows"] = max(p[2] for p in per) / 1e6
        rec["rows_received"] = res["rows"]
        if base.nccl is not None:      # the layer users write, at the same token count
            a2a = (lambda tt, s, r_: a2a_single(tt, s, r_, group=base.nccl))
            err, nres = None, {}
            try:
                el = e // rk.w
                for it in range(iters + 1):
                    (st, s_, r_, got), td = _phase_time(rk, lambda: permuted_dispatch(
                        x, idx, w, el, rk.w, fp8, a2a, group=base.nccl))
                    yy = received_rows(got, fp8, x.dtype)
                    _, tc = _phase_time(rk, lambda: permuted_combine(yy, x, st, s_, r_, a2a))
                    if it:
                        nres.setdefault("dispatch", []).append(td)
                        nres.setdefault("combine", []).append(tc)
            except Exception as ex:  # noqa: BLE001
                err = f"{type(ex).__name__}: {str(ex)[:300]}"
            ok = rk.all_ok(err is None)
            if ok:
                per = rk.gather([int(statistics.median(nres[q]) * 1e9)
                                 for q in ("dispatch", "combine")])
                rec["ms"]["nccl layer dispatch"] = max(p[0] for p in per) / 1e6
                rec["ms"]["nccl layer combine"] = max(p[1] for p in per) / 1e6
            else:
                rec["errors"]["nccl layer"] = rk.failed_elsewhere(err)
        else:
            rec["errors"]["nccl layer"] = base.nccl_reason
        ms = rec["ms"]
        if "nccl layer dispatch" in ms:
            rec["speedup"] = (ms["nccl layer dispatch"] + ms["nccl layer combine"]) / \
                (ms["tilecomm dispatch"] + ms["tilecomm combine"])
        rows.append(rec)
        rk.log(rec)
    return rows


def run(rk, deadline: float) -> list[dict]:
    return checks_then_timings(rk, deadline, checks, timings, 0.55)

"""Phase ``graph``: an 8 KB all_reduce on a heap tensor captured in a ``torch.cuda.CUDAGraph``
and replayed on fresh data (two replays checked exactly, then replays timed). A capture that
fails is this case's failure. Not applicable in the interpreter (no CUDA graphs)."""

from __future__ import annotations

import statistics

import torch

from ..cases import exact_data


def run(rk, deadline: float) -> list[dict]:
    rec = dict(phase="graph", case=f"all_reduce/graph/sum/float32/heap/8K/w{rk.w}",
               kernel="all_reduce/graph", world=rk.w)
    if not rk.cuda:
        return [dict(rec, ok=None, applicable=False,
                     error="n/a: CUDA graphs need a GPU (interpret mode)")]
    if not rk.in_time(deadline):
        return [rk.skipped(rec)]
    count = 8192 // 4
    timing = {}

    def fn():
        x = rk.comm.alloc((count,), torch.float32, device="cuda")
        x.fill_(1)
        rk.comm.all_reduce(x)         # warm outside the capture
        rk.sync()
        g = torch.cuda.CUDAGraph()
        try:
            with torch.cuda.graph(g, capture_error_mode="thread_local"):
                rk.comm.all_reduce(x)
        except Exception as e:  # noqa: BLE001
            raise RuntimeError(f"capture failed: {type(e).__name__}: {str(e)[:300]}")
        rk.sync()
        wrong = 0
        for k in range(2):              # two replays on fresh data, each verified
            ins = [exact_data(900 + k, j, count, torch.float32) for j in range(rk.w)]
            x.copy_(ins[rk.r])
            rk.sync()
            rk.comm.barrier()
            g.replay()
            rk.sync()
            wrong += rk.runner.count_wrong(x, torch.stack(ins).sum(0))
        chunk = rk.runner.safe_chunk("all_reduce", torch.float32, rk.w)
        secs = rk.runner.time_rounds(rk.comm.barrier, g.replay, 3, rk.cfg["latency_iters"], 3,
                                     refill=lambda: x.fill_(1), chunk=chunk,
                                     clock=rk.runner.Clock(rk.dev))
        timing["us"] = statistics.median(secs) * 1e6
        return wrong
    out = rk.judged(rec, fn)
    per = rk.gather([int(timing.get("us", -1) * 1000)])
    if out["ok"] and all(p[0] >= 0 for p in per):
        out["us_per_replay_slowest_rank"] = max(p[0] for p in per) / 1000
    rk.log(out)
    return [out]

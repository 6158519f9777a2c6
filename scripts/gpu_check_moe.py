"""The MoE kernel engine on a GPU: ranks sharing cuda:0 (CUDA IPC heap), every result bit for
bit against the CPU engine on the same inputs (the CPU engine is checked against the reference
in CI), several back-to-back calls, a few timings.

    python scripts/gpu_check_moe.py              # GPU: 2 and 4 ranks on cuda:0
    python scripts/gpu_check_moe.py --interpret  # the same code on CPU ranks (interpreter)

Prints ``RESULT {json}``; exit 0 when every case matched.
"""

from __future__ import annotations

import json
import os
import sys
import time

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tests", "moe"))

import tilecomm  # noqa: E402
import moe_scenarios as S  # noqa: E402
from tilecomm.moe import ExpertParallel  # noqa: E402
from tilecomm.moe.cpu import CpuEngine  # noqa: E402


def _run(comm, ep, x, idx, w, dtype, fp8, mode, m):
    kw = dict(mode="low_latency", max_tokens_per_rank=m) if mode == "low_latency" else {}
    d = ep.dispatch(x, idx, w, fp8=fp8, **kw)
    if mode == "low_latency":
        xs = d.dequantized(dtype) if fp8 else d.x
        y = torch.zeros_like(xs)
        for le in range(ep.el):
            y[le] = S.expert_output(xs[le], torch.full((xs.shape[1],), le, device=xs.device),
                                    comm.rank)
        out = ep.combine(y, d)
        return [d.count, d.src_rank, d.src_token, out]   # slots: -1 where unused, both engines
    y = S.normal_rows(d, comm.rank, dtype)
    out = ep.combine(y, d)
    got = [d.x, d.src_rank, d.src_token, d.topk_idx, d.topk_weights, d.tokens_per_expert, out]
    return got + ([d.scales] if fp8 else [])


def _graph_case(comm, dev):
    """Low-latency dispatch + experts + combine captured in one CUDA graph (NOTE [low latency
    on the device]) and replayed on new inputs copied into the captured tensors: each replay
    must give the CPU engine's bits for those inputs. Returns a result row."""
    h, e, k, t, m = 2048, 4 * comm.world_size, 4, 32, 32
    gpu = ExpertParallel(comm, num_experts=e, hidden=h, dtype=torch.bfloat16)
    cpu = ExpertParallel(comm, num_experts=e, hidden=h, dtype=torch.bfloat16)
    cpu._engines["kernel"] = cpu._engines["cpu"] = CpuEngine(comm)
    x, idx, w = (v.to(dev) for v in S.inputs(comm.rank, t, h=h, k=k, e=e, seed=50))

    def step():
        d = gpu.dispatch(x, idx, w, mode="low_latency", max_tokens_per_rank=m)
        y = torch.stack([S.expert_output(d.x[le], torch.full((d.x.shape[1],), le, device=dev),
                                         comm.rank) for le in range(gpu.el)])
        return gpu.combine(y, d)

    same, err = [], None
    try:
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(2):            # eager: the first call agrees on M with the peers
                step()
        torch.cuda.current_stream().wait_stream(side)
        torch.cuda.synchronize()
        comm.barrier()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            out = step()
        for i in range(3):
            xi, ii, wi = S.inputs(comm.rank, t, h=h, k=k, e=e, seed=60 + i)
            x.copy_(xi)
            idx.copy_(ii)
            w.copy_(wi)
            graph.replay()
            torch.cuda.synchronize()
            want = _run(comm, cpu, xi, ii, wi, torch.bfloat16, False, "low_latency", m)[-1]
            same.append(torch.equal(S.bits(out.cpu()), S.bits(want)))
    except Exception as exc:             # noqa: BLE001 -- reported as a failed row
        err = f"{type(exc).__name__}: {exc}"
    return dict(case=f"w{comm.world_size}/bfloat16/h{h}/e{e}/k{k}/t{t}/low_latency/cuda_graph",
                ok=err is None and len(same) == 3 and all(same), same=same, error=err, ms=0.0)


def rank_main(comm, dev, cases, iters):
    if dev == "cpu":
        os.environ["TRITON_INTERPRET"] = "1"
        comm.use_cpu_kernels("triton")
    rows = []
    layers = {}
    for i, (tokens, h, e, k, dt, fp8, mode) in enumerate(cases):
        dtype = getattr(torch, dt)
        key = (h, e, dt)
        if key not in layers:
            gpu = ExpertParallel(comm, num_experts=e, hidden=h, dtype=dtype)
            cpu = ExpertParallel(comm, num_experts=e, hidden=h, dtype=dtype)
            cpu._engines["kernel"] = cpu._engines["cpu"] = CpuEngine(comm)
            layers[key] = (gpu, cpu)
        gpu, cpu = layers[key]
        x, idx, w = S.inputs(comm.rank, tokens[comm.rank], h=h, k=k, e=e, dtype=dtype, seed=i)
        m = max(tokens)
        t0 = time.perf_counter()
        got = _run(comm, gpu, x.to(dev), idx.to(dev), w.to(dev), dtype, fp8, mode, m)
        if dev != "cpu":
            torch.cuda.synchronize()
        dt_s = time.perf_counter() - t0
        want = _run(comm, cpu, x, idx, w, dtype, fp8, mode, m)
        same = [torch.equal(S.bits(a.cpu()), S.bits(b)) for a, b in zip(got, want)]
        rows.append(dict(case=f"w{comm.world_size}/{dt}/h{h}/e{e}/k{k}/t{tokens}/"
                         f"{'fp8/' if fp8 else ''}{mode}", ok=all(same), same=same,
                         ms=round(dt_s * 1e3, 2)))
    if dev != "cpu":
        rows.append(_graph_case(comm, dev))
    timing = {}
    if iters and dev != "cpu":
        h, e, k, t = 7168, 8 * comm.world_size, 8, 512
        ep = ExpertParallel(comm, num_experts=e, hidden=h, dtype=torch.bfloat16)
        x, idx, w = S.inputs(comm.rank, t, h=h, k=k, e=e, seed=99, drop=0.0)
        x, idx, w = x.to(dev), idx.to(dev), w.to(dev)
        for _ in range(2):
            d = ep.dispatch(x, idx, w)
            ep.combine(d.x, d)
        torch.cuda.synchronize()
        comm.barrier()
        t0 = time.perf_counter()
        for _ in range(iters):
            d = ep.dispatch(x, idx, w)
        torch.cuda.synchronize()
        t1 = time.perf_counter()
        for _ in range(iters):
            ep.combine(d.x, d)
        torch.cuda.synchronize()
        t2 = time.perf_counter()
        rows_got = int(d.layout.rows)
        # the memory bound of the same bytes on this GPU: one device copy of the received rows
        buf = torch.empty_like(d.x)
        buf.copy_(d.x)
        torch.cuda.synchronize()
        t3 = time.perf_counter()
        for _ in range(iters):
            buf.copy_(d.x)
        torch.cuda.synchronize()
        t4 = time.perf_counter()
        # low-latency mode at a decode batch (128 tokens per rank)
        xl, il, wl = S.inputs(comm.rank, 128, h=h, k=k, e=e, seed=98, drop=0.0)
        xl, il, wl = xl.to(dev), il.to(dev), wl.to(dev)
        for _ in range(2):
            dl = ep.dispatch(xl, il, wl, mode="low_latency", max_tokens_per_rank=128)
            ep.combine(dl.x, dl)
        torch.cuda.synchronize()
        comm.barrier()
        t5 = time.perf_counter()
        for _ in range(iters):
            dl = ep.dispatch(xl, il, wl, mode="low_latency", max_tokens_per_rank=128)
        torch.cuda.synchronize()
        t6 = time.perf_counter()
        for _ in range(iters):
            ep.combine(dl.x, dl)
        torch.cuda.synchronize()
        t7 = time.perf_counter()
        ms = [(b - a) / iters * 1e3 for a, b in ((t0, t1), (t1, t2), (t3, t4), (t5, t6),
                                                 (t6, t7))]
        nbytes = rows_got * h * 2                 # DeepEP's count: received rows x row bytes
        timing = dict(tokens=t, hidden=h, experts=e, topk=k, rows_received=rows_got,
                      dispatch_ms=round(ms[0], 3), combine_ms=round(ms[1], 3),
                      copy_same_bytes_ms=round(ms[2], 4),
                      dispatch_GBps=round(nbytes / ms[0] / 1e6, 1),
                      combine_GBps=round(nbytes / ms[1] / 1e6, 1),
                      ll128_dispatch_us=round(ms[3] * 1e3, 1),
                      ll128_combine_us=round(ms[4] * 1e3, 1))
    return rows, timing


def main():
    interp = "--interpret" in sys.argv
    if interp:
        worlds, dev, iters = [2, 3], "cpu", 0
    else:
        worlds, dev, iters = [2, 4], "cuda:0", 10
    res, ok = {}, True
    for w in worlds:
        if interp:
            cases = [([5, 0, 4][:w], 32, 2 * w, 3, "bfloat16", False, "normal"),
                     ([3, 6, 2][:w], 128, 2 * w, 2, "bfloat16", True, "normal"),
                     ([4, 4, 1][:w], 17, 2 * w, 2, "float32", False, "low_latency")]
        else:
            big = [96] * w
            big[-1] = 0
            cases = [(big, 7168, 8 * w, 8, "bfloat16", False, "normal"),
                     ([64] * w, 7168, 8 * w, 8, "bfloat16", False, "normal"),   # back to back
                     ([33 + r for r in range(w)], 1001, 4 * w, 4, "float32", False, "normal"),
                     ([20] * w, 33, 2 * w, 2, "float16", False, "normal"),
                     ([48] * w, 7168, 8 * w, 8, "bfloat16", True, "normal"),
                     ([40] * w, 2048, 4 * w, 4, "bfloat16", False, "low_latency"),
                     ([200] * w, 7168, 8 * w, 8, "bfloat16", False, "normal")]   # grows
        t0 = time.time()
        out = tilecomm.launch(rank_main, w, dev, cases, iters, timeout=120,
                              heap_bytes=64 << 20)
        rows = [r for rk in out for r in rk[0]]
        ok = ok and all(r["ok"] for r in rows)
        res[f"w{w}"] = dict(ok=all(r["ok"] for r in rows), seconds=round(time.time() - t0, 1),
                            failed=[r for r in rows if not r["ok"]],
                            ms=[r["ms"] for r in out[0][0]], timing=out[0][1])
        print(f"world {w}: {'ok' if res[f'w{w}']['ok'] else 'FAIL'} {res[f'w{w}']}", flush=True)
    print("RESULT " + json.dumps(res))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())

"""Text reports for ``tilecomm model`` (rich tables)."""

from __future__ import annotations

from .training import PARALLELISMS, StepResult

GB = 1e9


def _console():
    from rich.console import Console
    c = Console()
    return c if c.is_terminal else Console(width=160)


def _fmt_bytes(n: float) -> str:
    for unit, f in (("GB", 1e9), ("MB", 1e6), ("KB", 1e3)):
        if n >= f:
            return f"{n / f:.1f} {unit}"
    return f"{n:.0f} B"


def cluster_text(r) -> str:
    """Where a result runs, in words: ``1024 GPUs in 128 x dgx-h100 nodes`` (``r.system`` names
    one node, so "1024 x dgx-h100" would read as 1024 nodes)."""
    from .comm import spec_of
    full = spec_of(r.system).gpus_per_node
    gpn = getattr(r, "gpus_per_node", 0) or full
    nodes = -(-r.gpus // gpn)
    where = f"{nodes} x {r.system} nodes" if nodes > 1 else f"1 {r.system} node"
    if nodes > 1 and gpn < full:
        where += f" ({gpn} of {full} GPUs each)"
    return f"{r.gpus} GPU{'s' if r.gpus != 1 else ''} in {where}"


def print_report(results: list, search: bool = False, total: int = 0) -> None:
    from rich.table import Table

    from .search import explain
    c = _console()
    r0 = results[0]
    train = isinstance(r0, StepResult)
    if search:
        head = (f"{r0.model} on {cluster_text(r0)} ({r0.gpu}, {r0.kernels} kernels), global "
                f"batch {r0.global_batch} x {r0.seq} tokens"
                if train else f"{r0.model} {r0.mode} on {cluster_text(r0)}, batch "
                f"{r0.batch}, prompt {r0.prompt}")
        t = Table(title=f"{head}: {len(results)} fastest of {total} layouts that fit",
                  header_style="bold")
        if train:
            for col in ("#", "layout", "mb", "recompute", "step s", "tok/s/GPU", "MFU",
                        "compute", "tp", "cp", "ep", "pp", "dp", "bubble", "mem GB"):
                t.add_column(col, justify="left" if col in ("layout", "recompute") else "right")
            for i, r in enumerate(results, 1):
                b = r.breakdown_s
                t.add_row(str(i), r.layout.short(), str(r.micro_batch), r.layout.recompute,
                          f"{r.step_s:.3f}", f"{r.tokens_per_s_per_gpu:,.0f}", f"{r.mfu:.1%}",
                          *[f"{b[k] / r.step_s:.1%}" for k in ("compute", *PARALLELISMS,
                                                                 "bubble")],
                          f"{r.memory['total'] / GB:.1f}")
        else:
            for col in ("#", "layout", "latency ms", "tok/s", "tok/s/GPU", "tp ms", "ep ms",
                        "pp ms", "mem GB"):
                t.add_column(col, justify="left" if col == "layout" else "right")
            for i, r in enumerate(results, 1):
                b = r.breakdown_s
                t.add_row(str(i), r.layout.short(), f"{r.latency_s * 1e3:.2f}",
                          f"{r.tokens_per_s:,.0f}", f"{r.tokens_per_s_per_gpu:,.0f}",
                          f"{b.get('tp', 0) * 1e3:.2f}", f"{b.get('ep', 0) * 1e3:.2f}",
                          f"{b.get('pp', 0) * 1e3:.2f}", f"{r.memory['total'] / GB:.1f}")
        c.print(t)
        c.print(explain(results))
        return
    r = r0
    if train:
        c.print(f"[bold]{r.model}[/] on {cluster_text(r)} ({r.gpu}, forward GEMMs and "
                f"attention at {r.efficiency:.0%} of {r.dtype} peak, {r.kernels} kernels): "
                f"{r.layout.short()}, SP "
                f"{'on' if r.layout.sp else 'off'}, ZeRO-{r.layout.zero}, recompute "
                f"{r.layout.recompute}, global batch {r.global_batch} x {r.seq} tokens, "
                f"micro-batch {r.micro_batch} ({r.micro_batches} per pipeline)")
        if r.layers % (r.layout.pp * r.layout.vpp):
            c.print(f"uneven stages: {r.layers} layers over pp*vpp = "
                    f"{r.layout.pp * r.layout.vpp} chunks; the step is timed on the most loaded "
                    f"stage ({-(-r.layers // r.layout.pp)} layers)")
        c.print(f"step {r.step_s:.3f} s, {r.tokens_per_s:,.0f} tokens/s "
                f"({r.tokens_per_s_per_gpu:,.0f} per GPU), MFU {r.mfu:.1%}, "
                f"{r.hw_tflops_per_gpu:.0f} TFLOP/s per GPU (Megatron convention)")
        k, share = r.limiter
        c.print(f"limited by: [bold]{k}[/] ({share:.1%} of the step); compute: " +
                ", ".join(f"{n} {v:.3f} s" for n, v in r.compute_s.items() if v > 0))
        t = Table("part", "exposed s", "share", "before overlap s", "group placement",
                  title="step time breakdown", header_style="bold")
        for k, v in r.breakdown_s.items():
            if v == 0 and r.comm_total_s.get(k, 0) == 0:
                continue
            t.add_row(k, f"{v:.3f}", f"{v / r.step_s:.1%}",
                      f"{r.comm_total_s[k]:.3f}" if k in r.comm_total_s else "",
                      r.groups.get(k, ""))
        c.print(t)
    else:
        unit = "time to first token" if r.mode == "prefill" else "per output token"
        c.print(f"[bold]{r.model}[/] {r.mode} on {cluster_text(r)}: {r.layout.short()}, "
                f"batch {r.batch}, prompt {r.prompt}, context {r.context}, {r.dtype}")
        c.print(f"latency {r.latency_s * 1e3:.2f} ms ({unit}), {r.tokens_per_s:,.0f} tokens/s "
                f"({r.tokens_per_s_per_gpu:,.0f} per GPU); KV cache "
                f"{_fmt_bytes(r.kv_bytes_per_request)} per request"
                + (f", moved prefill->decode in {r.kv_transfer_s * 1e3:.2f} ms"
                   if r.mode == "serve" else ""))
        t = Table("part", "ms", title="critical path", header_style="bold")
        for k, v in r.breakdown_s.items():
            t.add_row(k, f"{v * 1e3:.3f}")
        c.print(t)
    t = Table("parallelism", "collective", "bytes", "group", "placement", "per step", "us each",
              "total ms", title="collectives per rank", header_style="bold")
    for x in r.collectives:
        t.add_row(x.parallelism, x.collective, _fmt_bytes(x.nbytes), str(x.group), x.where,
                  f"{x.count:,}", f"{x.time_us:,.1f}", f"{x.total_us / 1e3:,.2f}")
    c.print(t)
    m = r.memory
    parts = ", ".join(f"{k} {v / GB:.1f}" for k, v in m.items()
                      if k not in ("total", "capacity", "usable"))
    c.print(f"memory per GPU: {m['total'] / GB:.1f} GB ({parts}) of {m['capacity'] / GB:.0f} GB "
            f"({m['usable'] / GB:.0f} usable): {'fits' if r.fits else '[red]does not fit[/]'}")

"""Search: enumerate valid layouts, keep those that fit in memory, rank them, explain the best.

Training layouts: tp over the powers of two that divide the node and the heads, cp over powers
of two (only when seq >= 16K: shorter sequences do not need it), pp over the divisors of the
remaining GPUs up to the layer count, vpp in {1, 2, 4} (interleaving needs m % pp == 0, as in
Megatron-LM), ep over powers of two dividing the experts and cp*dp, micro-batch in ``mbs``.
SP is on whenever tp > 1 (it only removes memory and turns all_reduce into
all_gather+reduce_scatter of the same bytes). Full recompute is tried only for a layout that
does not fit without it.
"""

from __future__ import annotations

from .comm import spec_of
from .inference import InferResult, infer
from .layout import Layout, validate
from .models import ModelSpec, load_model
from .training import PARALLELISMS, StepResult, node_size, train_step


def _pow2_upto(n: int) -> list[int]:
    out, v = [], 1
    while v <= n:
        out.append(v)
        v *= 2
    return out


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def train_layouts(model: ModelSpec, gpus: int, gpus_per_node: int, global_batch: int,
                  seq: int, mbs=(1, 2), zero: int = 1, vpps=(1, 2, 4), tp_overlap=False,
                  ep_overlap=False):
    """Yield (layout, micro_batch) pairs that pass :func:`validate` and divide the batch."""
    cps = [c for c in _pow2_upto(32) if seq >= 16384 or c == 1]
    eps = _pow2_upto(model.experts) if model.is_moe else [1]
    for tp in _pow2_upto(min(gpus_per_node, gpus)):
        for cp in cps:
            if gpus % (tp * cp):
                continue
            rest = gpus // (tp * cp)
            for pp in _divisors(rest):
                if pp > model.layers:
                    break
                dp = rest // pp
                for mb in mbs:
                    if global_batch % (dp * mb):
                        continue
                    m = global_batch // (dp * mb)
                    for v in vpps:
                        if v > 1 and (pp == 1 or m % pp):
                            continue
                        for ep in eps:
                            L = Layout(tp=tp, pp=pp, dp=dp, cp=cp, ep=ep, vpp=v, zero=zero,
                                       sp=tp > 1, tp_overlap=tp_overlap and tp > 1,
                                       ep_overlap=ep_overlap and ep > 1)
                            try:
                                validate(L, model, gpus, gpus_per_node, seq)
                            except ValueError:
                                continue
                            yield L, mb


def search_train(model: str | ModelSpec, system: str, gpus: int, global_batch: int,
                 seq: int = 4096, dtype: str = "bf16", mbs=(1, 2), zero: int = 1,
                 vpps=(1, 2, 4), tp_overlap: bool = False,
                 ep_overlap: bool = False, gpus_per_node: int | None = None,
                 kernels: str = "fused") -> list[StepResult]:
    """Every valid layout that fits in memory, fastest step first (``gpus_per_node``,
    ``kernels``: as :func:`train_step`)."""
    model = load_model(model)
    g = node_size(gpus, spec_of(system).gpus_per_node, gpus_per_node)
    kw = dict(gpus_per_node=g, kernels=kernels)
    out = []
    for L, mb in train_layouts(model, gpus, g, global_batch, seq, mbs, zero, vpps, tp_overlap,
                                ep_overlap):
        r = train_step(model, system, gpus, L, global_batch, mb, seq, dtype, **kw)
        if not r.fits:
            r = train_step(model, system, gpus, L.with_(recompute="full"), global_batch, mb,
                           seq, dtype, **kw)
        if r.fits:
            out.append(r)
    if not out:
        raise ValueError(f"no layout of {model.name} on {gpus} GPUs of {system} fits in memory "
                         f"(global batch {global_batch}, seq {seq}, ZeRO-{zero}, full recompute "
                         "tried); "
                         + ("add GPUs, shorten seq or shard more state (--zero 3)" if zero < 3
                            else "add GPUs or shorten seq"))
    return sorted(out, key=lambda r: (r.step_s, r.layout.pp, r.layout.tp))


def search_infer(model: str | ModelSpec, system: str, gpus: int, batch: int,
                 prompt: int = 2048, gen: int = 256, mode: str = "decode",
                 dtype: str = "bf16") -> list[InferResult]:
    """Replica layouts of exactly ``gpus`` GPUs that fit, lowest latency first."""
    model = load_model(model)
    g = spec_of(system).gpus_per_node
    out = []
    eps = _pow2_upto(model.experts) if model.is_moe else [1]
    for tp in _pow2_upto(min(g, gpus)):
        for pp in _divisors(gpus // tp) if gpus % tp == 0 else []:
            dp = gpus // (tp * pp)
            for ep in eps:
                L = Layout(tp=tp, pp=pp, dp=dp, ep=ep)
                try:
                    validate(L, model, gpus, g)
                    r = infer(model, system, L, batch, prompt, gen, mode, dtype)
                except ValueError:
                    continue
                if r.fits:
                    out.append(r)
    if not out:
        raise ValueError(f"no {mode} layout of {model.name} on {gpus} GPUs of {system} fits in "
                         f"memory with batch {batch} (batch must be a multiple of dp*pp)")
    return sorted(out, key=lambda r: (r.latency_s, -r.tokens_per_s))


def _parts(r) -> dict:
    return {k: v for k, v in r.breakdown_s.items() if v > 0}


def label(r) -> str:
    """A result's layout, plus micro-batch and recompute for training (two results can share a
    layout and differ only in those)."""
    s = r.layout.short()
    if isinstance(r, StepResult):
        s += f" mb{r.micro_batch}" + (f" recompute {r.layout.recompute}"
                                      if r.layout.recompute != "none" else "")
    return s


def explain(results: list, n: int = 3) -> str:
    """Why the top layout wins: its largest costs, and what each runner-up loses, and where."""
    best = results[0]
    t0 = best.step_s if isinstance(best, StepResult) else best.latency_s
    lines = []
    parts = sorted(_parts(best).items(), key=lambda kv: -kv[1])
    share = ", ".join(f"{k} {v / t0:.0%}" for k, v in parts if v / t0 >= 0.005)
    lines.append(f"Best: {label(best)} ({share}).")
    if isinstance(best, StepResult):
        k, share = best.limiter
        lines.append(f"It is limited by {k} ({share:.0%} of the step).")
        comm = {k: best.breakdown_s[k] for k in PARALLELISMS if best.breakdown_s[k] > 0}
        if comm:
            k = max(comm, key=comm.get)
            lines.append(f"Its largest exposed communication is {k.upper()} "
                         f"({comm[k] / t0:.1%} of the step; {best.comm_total_s[k] / t0:.1%} "
                         "before overlap).")
        lines.append(f"Memory {best.memory['total'] / 1e9:.1f} of "
                     f"{best.memory['usable'] / 1e9:.0f} GB usable; recompute "
                     f"{best.layout.recompute}.")
    for r in results[1:n]:
        t = r.step_s if isinstance(r, StepResult) else r.latency_s
        diff = {k: r.breakdown_s.get(k, 0) - best.breakdown_s.get(k, 0)
                for k in set(r.breakdown_s) | set(best.breakdown_s)}
        worse = sorted(((k, v) for k, v in diff.items() if v > 1e-9), key=lambda kv: -kv[1])
        why = ", ".join(f"+{v / t0:.1%} {k}" for k, v in worse[:2]) or "ties"
        lines.append(f"  {label(r)}: {t / t0 - 1:+.1%} ({why}).")
    return "\n".join(lines)

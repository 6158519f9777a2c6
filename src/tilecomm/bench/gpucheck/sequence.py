"""Phase ``sequence``: calls of different kernels, sizes and memory kinds issued back to back
with no synchronization or check between them, then every result verified (what the
asynchronous calls promise: epochs and scratch halves keep consecutive calls apart)."""

from __future__ import annotations

from ..cases import CASES
from . import kernels as K


def pick(table, n: int):
    """Up to ``n`` rows, one per (kernel, size, memory), float32 sum, kernels round-robin."""
    picks, seen = [], set()
    for case in table:
        key = (case.kernel, case.nbytes, case.mem)
        if case.dtype == "float32" and case.redop == "sum" and key not in seen:
            seen.add(key)
            picks.append(case)
    by_kernel: dict = {}
    for c in picks:
        by_kernel.setdefault(c.kernel, []).append(c)
    seq = []
    while len(seq) < n and any(by_kernel.values()):
        for k in list(by_kernel):
            if by_kernel[k] and len(seq) < n:
                seq.append(by_kernel[k].pop(len(by_kernel[k]) // 2))
    return seq


def run(rk, deadline: float) -> list[dict]:
    fused, plans = K.registered(rk.cfg)
    seq = pick(K.correctness_table(rk.cfg, rk.w, fused, plans), rk.cfg["seq_len"])
    rec = dict(phase="sequence", case=f"sequence/{len(seq)}/w{rk.w}",
               kernel="back-to-back sequence", world=rk.w, calls=[c.id for c in seq])
    if not rk.in_time(deadline):
        return [rk.skipped(rec)]
    wrong_at: list[str] = []

    def fn():
        made = [(c, rk.runner.make_buffers(rk.comm, c, rk.dev)) for c in seq]
        wants = [rk.runner.prepare_call(rk.comm, c, b, 7000 + i)
                 for i, (c, b) in enumerate(made)]
        rk.sync()
        for c, b in made:
            with K.engine(c.engine):
                CASES[c.op].run(rk.comm, b, c.algo)
        rk.sync()
        total = 0
        for (c, b), want in zip(made, wants):
            k = rk.runner.count_wrong(rk.runner.result_of(c, b), want)
            if k:
                wrong_at.append(c.id)
            total += k
        return total
    out = rk.judged(rec, fn)
    if wrong_at:
        out["error"] = f"{out['error']} in {', '.join(wrong_at[:4])}"
    rk.log(out)
    return [out]

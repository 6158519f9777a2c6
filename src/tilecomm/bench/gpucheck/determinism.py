"""Phase ``determinism``: ``comm.deterministic = True`` with ``algo="auto"`` on random bf16 at
the smallest size auto sends to two_shot (in the interpreter at most 512 KiB: where the GPU
preset's two_shot starts late, as on 2 GPUs, the dry run would interpret tens of MiB): the bits
must be ``reference.rank_order_reduced``'s."""

from __future__ import annotations

import torch

from ... import reference, tuner
from ...algorithms.lower import deterministic_algorithms
from ...backends.triton import registry
from ...units import format_size
from ..cases import random_data
from .bits import bits_of, differ


def run(rk, deadline: float) -> list[dict]:
    avail = deterministic_algorithms("all_reduce", rk.w, among=registry.supported("all_reduce"))
    nbytes = 8 << 10
    top = (512 << 10) if rk.cfg["interpret"] else (64 << 20)
    while nbytes < top and tuner.choose("all_reduce", nbytes, rk.w, kind="gpu",
                                               available=avail) != "two_shot":
        nbytes *= 2
    count = nbytes // 2
    rec = dict(phase="determinism",
               case=f"all_reduce/auto/sum/bfloat16/heap/{format_size(nbytes)}/w{rk.w}"
                    f"/deterministic", kernel="all_reduce/deterministic", world=rk.w,
               dtype="bfloat16", redop="sum", mem="heap", bytes=nbytes, count=count,
               engine="fused", algo_auto=tuner.choose("all_reduce", nbytes, rk.w, kind="gpu",
                                                      available=avail))
    if not rk.in_time(deadline):
        return [rk.skipped(rec)]

    def fn():
        inputs = [random_data(77, j, count, torch.bfloat16) for j in range(rk.w)]
        x = rk.runner.heap_alloc(rk.comm, count, torch.bfloat16, rk.dev)
        x.copy_(inputs[rk.r])
        rk.comm.deterministic = True
        try:
            rk.comm.all_reduce(x, "sum")
            rk.sync()
        finally:
            rk.comm.deterministic = False
        return differ(bits_of(x, "bfloat16"),
                      bits_of(reference.rank_order_reduced(inputs), "bfloat16"))
    out = rk.judged(rec, fn)
    if out["error"] and "wrong elements" in out["error"]:
        out["error"] = out["error"].replace("wrong elements",
                                            "elements' bits differ from rank order")
    rk.log(out)
    return [out]

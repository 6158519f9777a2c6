"""Compile the MoE kernels (tilecomm.backends.triton.kernels.moe) for sm_90 without a GPU and
report what their PTX relies on; run by test_moe_kernel.py in a subprocess WITHOUT
TRITON_INTERPRET (the kernels must be JIT functions). Prints ``RESULT {json}``; exit 3: this
triton cannot compile for CUDA.

Compiled as a real launch on 16-byte aligned tensors is: every pointer argument carries
Triton's ``tt.divisibility = 16`` attribute (the ``D`` of its launch specialization), the
aligned variant (``ALIGNED=1``: rows a multiple of 16 bytes), 8 ranks, int64 words (bf16 rows
of 7168 channels are 1792 words)."""

from __future__ import annotations

import json
import os
import sys

if os.environ.get("TRITON_INTERPRET", "0") not in ("", "0"):
    sys.exit("unset TRITON_INTERPRET")

from tilecomm.device import compile_check as cc  # noqa: E402

why = cc.cuda_backend_available()
if why is not None:
    print(why, file=sys.stderr)
    sys.exit(3)

import re  # noqa: E402

import triton  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.compiler import ASTSource  # noqa: E402

from tilecomm.backends.triton.kernels import moe  # noqa: E402


def compile_aligned(kernel, sig, consts):
    """``compile_for`` with every pointer argument tagged 16-byte divisible."""
    names = list(sig)
    attrs = {(i,): [["tt.divisibility", 16]] for i, n in enumerate(names)
             if sig[n].startswith("*")}
    full = dict(sig)
    for n in consts:
        full[n] = "constexpr"
    src = ASTSource(fn=kernel, signature=full, constexprs=dict(consts), attrs=attrs)
    return triton.compile(src, target=GPUTarget("cuda", 90, 32))


def report(k):
    ptx = k.asm["ptx"]
    acc = cc.global_accesses(ptx)
    return {
        "ordering": cc.ordering_problems(ptx),
        # signal_set: Triton 3.9 prints atom.global.sys.release.exch (scope, then order)
        "release_sys": len(re.findall(r"atom\.global\.(?:sys\.release|release\.sys)\.", ptx)),
        # wait_ge: an acquire load, lowered to ld.relaxed.sys + fence.acquire.sys
        "acquire_sys": len(re.findall(r"ld\.global\.acquire\.sys|fence\.acquire\.sys", ptx)),
        "ld128": acc.get(("ld", 128), 0), "st128": acc.get(("st", 128), 0),
        "accesses": {f"{a}{b}": c for (a, b), c in acc.items()},
    }


res = {}
entries = {(e[0].__name__, e[2].get("ALIGNED", 1), e[1].get("x", e[1].get("y",
           e[1].get("recv")))): e for e in moe.COMPILE}
for key, name in (("dispatch", "moe_dispatch_push"), ("combine", "moe_combine_push"),
                  ("ll_dispatch", "moe_ll_dispatch_push"), ("ll_combine", "moe_ll_combine_push")):
    kernel, sig, consts = entries[(name, 1, "*i64")]
    res[key] = report(compile_aligned(kernel, sig, consts))
kernel, sig, consts = entries[("moe_combine_sum", 1, "*bf16")]
res["sum"] = report(compile_aligned(kernel, sig, consts))
print("RESULT " + json.dumps(res))

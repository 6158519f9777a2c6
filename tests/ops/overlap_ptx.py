"""Compile the fused-op kernels for sm_90 (no interpreter, no GPU) and print, as one JSON line
``RESULT {...}``, what their PTX does: tensor-core MMAs, acquire fences of the waits, release
atomics of the signals, memory-ordering problems (tilecomm.device.compile_check). Run by
tests/ops/test_overlap_kernels.py in a subprocess (the pytest process must not import triton
without the interpreter). Exit 3: this triton cannot compile for CUDA."""

import json
import re
import sys

from tilecomm.device import compile_check as cc


def main() -> int:
    why = cc.cuda_backend_available()
    if why:
        print(why, file=sys.stderr)
        return 3
    from tilecomm.backends.triton.kernels import overlap_gemm as og

    res = {}
    for kernel, sig, consts in og.COMPILE:
        if "bf16" not in sig.get("b", ""):
            continue                       # bf16 only: the 16-bit tensor-core path
        ptx = cc.compile_for(kernel, sig, consts).asm["ptx"]
        ops = re.findall(r"^\s*(?:@%p\d+\s+)?([a-z][\w.:]*)", ptx, re.M)
        res[kernel.__name__] = {
            "mma": sum(o.startswith(("wgmma.mma_async", "mma.sync")) for o in ops),
            "acquire_fences": sum(o.startswith("fence.acquire.sys") for o in ops),
            "relaxed_sys_loads": sum(o.startswith("ld.relaxed.sys") or o.startswith(
                "ld.global.relaxed.sys") for o in ops),
            "release_atomics": sum(o.startswith(("atom.", "red.")) and ".release" in o
                                   and ".sys" in o for o in ops),
            "ordering": cc.ordering_problems(ptx),
            **cc.sync_counts(ptx),
        }
    print("RESULT " + json.dumps(res))
    return 0


if __name__ == "__main__":
    sys.exit(main())

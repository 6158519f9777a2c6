"""Subprocess body of test_avg_division (needs a real Triton compiler: no TRITON_INTERPRET).

Compiles a kernel that divides with ``/`` and one that uses ``common.finish`` for sm_90 and
prints whether :func:`compile_check.arithmetic_problems` flags each.
"""

import triton
import triton.language as tl

from tilecomm.backends.triton.kernels.common import finish
from tilecomm.device.compile_check import arithmetic_problems, compile_for


@triton.jit
def divide_with_slash(x, n, W: tl.constexpr):
    o = tl.arange(0, 128)
    v = tl.load(x + o, mask=o < n)
    tl.store(x + o, v / W, mask=o < n)


@triton.jit
def divide_with_finish(x, n, W: tl.constexpr):
    o = tl.arange(0, 128)
    v = tl.load(x + o, mask=o < n)
    tl.store(x + o, finish(v, 1, W), mask=o < n)


if __name__ == "__main__":
    import sys

    from tilecomm.device.compile_check import cuda_backend_available

    why = cuda_backend_available()
    if why:
        print(why, file=sys.stderr)
        sys.exit(3)
    sig = {"x": "*fp32", "n": "i32"}
    old = arithmetic_problems(compile_for(divide_with_slash, sig, {"W": 3}).asm["ptx"])
    new = arithmetic_problems(compile_for(divide_with_finish, sig, {"W": 3}).asm["ptx"])
    print("RESULT", int(bool(old)), int(bool(new)))

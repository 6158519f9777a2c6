"""avg divides with IEEE rounding on the GPU too.

Triton's ``/`` on fp32 compiles to ``div.approx.f32`` for sm_90, which does not give the
correctly rounded quotient the CPU executor and the rank-order reference compute; the
kernels divide with ``tl.div_rn`` (``common.finish``). The compile check of every registered
kernel (test_every_registered_kernel_compiles_for_sm90) rejects approximate divisions; this
test shows that check can fail.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.compile

HERE = os.path.dirname(os.path.abspath(__file__))


@pytest.mark.slow
def test_approximate_division_is_flagged_and_finish_divides_exactly():
    # (the availability check runs in the subprocess: importing triton here, without the
    # interpreter, would break the interpreter in rank processes forked from this one later)
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    r = subprocess.run([sys.executable, os.path.join(HERE, "divide_check.py")], env=env,
                       capture_output=True, text=True, timeout=300)
    if r.returncode == 3:
        pytest.skip(r.stderr.strip())
    assert r.returncode == 0, r.stderr[-3000:]
    line = [x for x in r.stdout.splitlines() if x.startswith("RESULT ")][-1]
    assert line.split()[1:] == ["1", "0"], line

"""``tilecomm.device.heap.require_interpreter``: the one guard every kernel engine (collectives,
fused ops, MoE) runs before kernels on CPU tensors. Each case runs in a fresh interpreter
process, since whether triton is imported decides the outcome."""

from __future__ import annotations

import pytest

import os
import subprocess
import sys
import textwrap

pytestmark = pytest.mark.interpreter


def _run(code: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], env=env,
                          capture_output=True, text=True, timeout=120)


def test_turns_the_interpreter_on_before_triton_is_imported():
    r = _run("""
        import os
        from tilecomm.device.heap import require_interpreter
        require_interpreter("the test")
        assert os.environ["TRITON_INTERPRET"] == "1"
        import triton, tilecomm.device.lang as lang
        print(lang.INTERPRETED)
        """)
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.strip() == "True"


def test_refuses_when_triton_was_imported_without_it():
    r = _run("""
        import triton
        from tilecomm import CommError
        from tilecomm.device.heap import require_interpreter
        try:
            require_interpreter("the MoE kernel engine")
        except CommError as e:
            print(e)
        """)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "the MoE kernel engine" in r.stdout and "TRITON_INTERPRET=1" in r.stdout, r.stdout

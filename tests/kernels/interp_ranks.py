"""Rank-side helpers for the kernel tests that drive a TritonBackend directly, in the Triton
interpreter, on ranks of ``rank_pool(w, "interpreter")`` (tests/conftest.py); and the sm_90
compile of a kernel module."""

from __future__ import annotations

import os
import sys

_BACKENDS: dict = {}


def kernel_backend(comm):
    """This rank's TritonBackend on CPU tensors (one per communicator, 5 s device waits)."""
    b = _BACKENDS.get(id(comm))
    if b is None:
        from tilecomm.backends.triton import TritonBackend
        b = _BACKENDS[id(comm)] = TritonBackend(comm, "cpu", timeout=5)
    return b


def compile_for_sm90(module: str) -> str:
    """Compile every kernel variant ``module`` lists for sm_90 (``tilecomm.device.
    compile_check``, in a process without the interpreter); return its stdout. Skips the test
    when triton has no CUDA backend, fails it on any compile error."""
    import subprocess

    import pytest

    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    r = subprocess.run([sys.executable, "-m", "tilecomm.device.compile_check", module],
                       env=env, capture_output=True, text=True, timeout=300)
    if r.returncode == 3:
        pytest.skip(r.stderr.strip())
    assert r.returncode == 0, r.stdout + r.stderr
    return r.stdout

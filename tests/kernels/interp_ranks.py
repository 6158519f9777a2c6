"""Rank-side helpers for the kernel tests that drive a TritonBackend directly, in the Triton
interpreter, on ranks of a tilecomm.RankGroup (the ``ranks`` fixture in conftest.py)."""

from __future__ import annotations

import gc
import os
import sys

_BACKENDS: dict = {}


def interpret(comm):
    """Run first on every rank: the interpreter must be on before triton is imported there."""
    assert "tilecomm.device.lang" not in sys.modules, "kernels imported without the interpreter"
    os.environ["TRITON_INTERPRET"] = "1"


def kernel_backend(comm):
    """This rank's TritonBackend on CPU tensors (one per communicator, 5 s device waits)."""
    b = _BACKENDS.get(id(comm))
    if b is None:
        from tilecomm.backends.triton import TritonBackend
        b = _BACKENDS[id(comm)] = TritonBackend(comm, "cpu", timeout=5)
    return b


def call(comm, fn, *args):
    """``fn(comm, *args)``, then collect garbage: symmetric tensors die with their last view,
    and frees must stay in step across ranks."""
    try:
        return fn(comm, *args)
    finally:
        gc.collect()


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


def kernel_ranks(comm):
    """Rank-side setup of a kernel-path pool: the interpreter on, CPU tensors on the kernels."""
    interpret(comm)
    comm.use_cpu_kernels("triton")


class RankPools:
    """Live rank groups per world size whose communicators run CPU tensors on the Triton
    kernels (``kernel_ranks``), kept across the tests of a module (starting ranks and
    compiling in the interpreter is slow). ``run(w, fn, *args)`` runs ``call(comm, fn,
    *args)`` on every rank; a group whose call raised is stopped and restarted next time."""

    def __init__(self, setup=kernel_ranks, heap_bytes: int = 8 << 20,
                 scratch_bytes: int = 64 << 10):
        self.setup, self.heap_bytes, self.scratch_bytes = setup, heap_bytes, scratch_bytes
        self.groups: dict = {}

    def group(self, w: int):
        import tilecomm
        from kernel_setup import live_group      # tests/ is on sys.path (conftest)

        def start(w):
            g = tilecomm.RankGroup(w, timeout=60, heap_bytes=self.heap_bytes,
                                   scratch_bytes=self.scratch_bytes).start()
            g.run(call, self.setup)
            return g
        return live_group(self.groups, w, start)

    def run(self, w: int, fn, *args):
        try:
            return self.group(w).run(call, fn, *args)
        except BaseException:
            self.discard(w)
            raise

    def discard(self, w: int) -> None:
        """Stop the group of ``w`` ranks (its ranks' epochs may be out of step)."""
        g = self.groups.pop(w, None)
        if g is not None:
            g.stop()

    def stop(self) -> None:
        for w in list(self.groups):
            self.discard(w)

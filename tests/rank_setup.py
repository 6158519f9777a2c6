"""What the shared rank pools (``rank_pool`` in conftest.py) run on their ranks.

A module of its own, not conftest: RankGroup sends functions to the ranks by reference, and
pytest imports more than one module named ``conftest``.

Engines: ``executor`` (CPU collectives on the schedule executor, no triton on the rank),
``interpreter`` (TRITON_INTERPRET=1 before triton is imported there; tests drive kernels
themselves), ``compat`` (the same, with lang's compatibility path) and ``kernels`` (the
interpreter, and the communicator runs CPU tensors on the Triton kernels).
"""

from __future__ import annotations

import gc
import os
import sys


def _freeze() -> None:
    # What exists after setup (torch, triton, the kernels' modules) lives as long as the rank:
    # kept out of the collector's sight, the gc.collect() every call ends with (and the one
    # use_cpu_kernels makes) costs microseconds instead of ~70 ms with triton loaded.
    gc.collect()
    gc.freeze()


def executor(comm) -> None:
    _freeze()


def interpreter(comm) -> int:
    """The interpreter must be on before triton is imported on the rank; then the kernels are
    imported once, here. Returns the rank's pid."""
    assert "triton" not in sys.modules, (
        "triton was imported in the pytest process before this pool's ranks forked from it, "
        "so TRITON_INTERPRET comes too late for them: run that test's triton import in a "
        "subprocess")
    os.environ["TRITON_INTERPRET"] = "1"
    import tilecomm.backends.triton  # noqa: F401
    import tilecomm.device.lang  # noqa: F401

    _freeze()
    return os.getpid()


def compat(comm) -> int:
    """The interpreter, with lang on its compatibility path (TILECOMM_DEVICE_COMPAT=1: as for
    a Triton without tl.atomic_load / tl.atomic_poll)."""
    from tilecomm.settings import settings

    os.environ["TILECOMM_DEVICE_COMPAT"] = "1"
    settings.cache_clear()          # forked ranks inherit the parent's cached settings
    return interpreter(comm)


def kernels(comm) -> None:
    """The interpreter, and CPU collectives of ``comm`` on the Triton kernels."""
    interpreter(comm)
    comm.use_cpu_kernels("triton")


SETUP = {"executor": executor, "interpreter": interpreter, "compat": compat, "kernels": kernels}


def call(comm, fn, *args):
    """``(fn(comm, *args), heap bytes in use after it)``, with garbage collected first:
    symmetric tensors are freed when their last view dies, and a view kept alive by a
    reference cycle (a traceback) on one rank only would make the next ``alloc`` diverge."""
    try:
        out = fn(comm, *args)
    finally:
        gc.collect()
    return out, comm.heap_bytes_in_use

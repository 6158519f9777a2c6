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


def _freeze() -> None:
    # What exists after setup (torch, triton, the kernels' modules) lives as long as the rank:
    # kept out of the collector's sight, the gc.collect() every call ends with (and the one
    # use_cpu_kernels makes) costs microseconds instead of ~70 ms with triton loaded.
    gc.collect()
    gc.freeze()


def executor(comm) -> None:
    _freeze()


def interpreter(comm) -> int:
    """The kernels in the Triton interpreter (conftest.py imported them that way before the
    ranks forked). Returns the rank's pid."""
    from tilecomm.device import lang

    assert lang.INTERPRETED and os.environ.get("TRITON_INTERPRET") == "1", \
        "the kernels were imported without the interpreter"
    _freeze()
    return os.getpid()


def compat(comm) -> int:
    """The interpreter, with lang on its compatibility path (TILECOMM_DEVICE_COMPAT=1, set by
    the pool for fresh rank processes: as for a Triton without tl.atomic_load /
    tl.atomic_poll)."""
    from tilecomm.device import lang

    assert lang.COMPAT, "lang was imported before TILECOMM_DEVICE_COMPAT was set"
    return interpreter(comm)


def kernels(comm) -> None:
    """The interpreter, and CPU collectives of ``comm`` on the Triton kernels."""
    interpreter(comm)
    comm.use_cpu_kernels("triton")


SETUP = {"executor": executor, "interpreter": interpreter, "compat": compat, "kernels": kernels}


def call(comm, engine, fn, *args):
    """``(fn(comm, *args), the rank's live heap blocks after it)``, garbage collected first:
    symmetric tensors are freed when their last view dies, and a view kept alive by a
    reference cycle (a traceback) on one rank only would make the next ``alloc`` diverge.
    The communicator is first put back on its engine's CPU path, which an earlier test may
    have switched (a no-op when it is already there)."""
    comm.use_cpu_kernels("triton" if engine == "kernels" else "executor")
    try:
        out = fn(comm, *args)
    finally:
        gc.collect()
    return out, comm.heap_blocks()

"""Rank setup shared by the kernel tests' rank pools (``kernel_group`` in conftest.py, the
``ranks`` fixture of tests/kernels, ``interp_ranks.RankPools``). A module of its own: RankGroup
sends functions to the ranks by reference, and ``conftest`` names a different module depending
on which test directory pytest collected last."""

from __future__ import annotations

import os


def kernels_on(comm):
    """CPU collectives on the Triton kernels, in the interpreter (set before triton is
    imported on the rank)."""
    os.environ["TRITON_INTERPRET"] = "1"
    comm.use_cpu_kernels("triton")


def live_group(groups: dict, w: int, start):
    """``groups[w]`` while every rank of it is alive; otherwise stop it and keep ``start(w)``
    (a started, set-up RankGroup) in its place. The kernel tests' rank pools share this:
    starting ranks and compiling in the interpreter is slow, and a dead rank's group is
    useless."""
    g = groups.get(w)
    if g is None or not all(p.is_alive() for p in g.procs):
        if g is not None:
            g.stop()
        g = groups[w] = start(w)
    return g

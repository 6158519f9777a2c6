"""Rank setup of the kernel tests' ``kernel_group`` fixture (conftest.py). A module of its
own: RankGroup sends the function to the ranks by reference, and ``conftest`` names a
different module depending on which test directory pytest collected last."""

from __future__ import annotations

import os


def kernels_on(comm):
    """CPU collectives on the Triton kernels, in the interpreter (set before triton is
    imported on the rank)."""
    os.environ["TRITON_INTERPRET"] = "1"
    comm.use_cpu_kernels("triton")

"""The ``ranks`` fixture: RankGroups (one per world size) whose ranks run kernels in the Triton
interpreter; a group whose process died is replaced."""

from __future__ import annotations

import pytest
from interp_ranks import interpret
from kernel_setup import live_group

import tilecomm


@pytest.fixture(scope="module")
def ranks():
    groups: dict[int, tilecomm.RankGroup] = {}

    def start(w):
        g = tilecomm.RankGroup(w, timeout=30, heap_bytes=4 << 20, scratch_bytes=64 << 10).start()
        g.run(interpret)
        return g

    def get(w):
        return live_group(groups, w, start)

    yield get
    for g in groups.values():
        g.stop()

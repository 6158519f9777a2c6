"""The ``ranks`` fixture: RankGroups (one per world size) whose ranks run kernels in the Triton
interpreter; a group whose process died is replaced."""

from __future__ import annotations

import pytest
from interp_ranks import interpret

import tilecomm


@pytest.fixture(scope="module")
def ranks():
    groups: dict[int, tilecomm.RankGroup] = {}

    def get(w):
        g = groups.get(w)
        if g is None or not all(p.is_alive() for p in g.procs):
            if g is not None:
                g.stop()
            g = tilecomm.RankGroup(w, timeout=30, heap_bytes=4 << 20,
                                   scratch_bytes=64 << 10).start()
            g.run(interpret)
            groups[w] = g
        return g

    yield get
    for g in groups.values():
        g.stop()

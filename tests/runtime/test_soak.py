"""The soak (tilecomm.soak): a seeded random mix of calls checked against the references.

CI runs a few thousand calls; ``scripts/soak.py`` runs long ones (docs/benchmarks.md, "Soak").
"""

from __future__ import annotations

import pytest
import torch

from tilecomm.algorithms import algorithms
from tilecomm.soak import COLLECTIVES, MOVABLE, REDUCING, soak_rank, spec

CALLS = 1500


@pytest.mark.parametrize("world_size", [2, 3])
def test_soak_mix_matches_the_references(rank_pool, world_size):
    results = rank_pool(world_size).run(soak_rank, 12, 0, CALLS)
    wrong = [line for r in results for line in r["wrong"]]
    assert not wrong, "\n".join(wrong[:20])
    assert sum(results[0]["by_collective"].values()) == CALLS


def test_the_mix_covers_every_collective_algorithm_dtype_and_layout():
    specs = [spec(12, 3, i) for i in range(CALLS)]
    seen = {(s.collective, s.algo) for s in specs}
    for c in COLLECTIVES:
        if c in ("barrier", "send_recv"):
            assert any(s.collective == c for s in specs), c
            continue
        for a in algorithms(c) + ["auto"]:
            assert (c, a) in seen, (c, a)
    moved = [s for s in specs if s.collective not in ("barrier",)]
    assert {s.dtype for s in moved} == set(MOVABLE)
    assert {s.op for s in specs if s.collective in REDUCING} == {"sum", "prod", "min", "max",
                                                                  "avg"}
    assert {s.layout for s in moved} == {"contig", "step2", "column"}
    assert any(s.heap for s in moved) and any(not s.heap for s in moved)
    assert any(s.deterministic for s in specs)
    assert any(s.rows == 0 for s in moved) and any(s.rows == -1 for s in moved)
    assert any(s.rows > 1 and s.rows % 2 for s in moved)
    assert any(s.rows == 1 and s.layout == "step2" for s in moved)  # one element, stride 2
    assert {s.out for s in specs if s.collective == "all_gather"} == {"none", "given", "heap"}
    # drawn from (seed, world, index) alone: every rank draws the same call
    assert spec(12, 3, 77) == spec(12, 3, 77) and spec(12, 3, 77) != spec(13, 3, 77)


class _OffByOne:
    """A communicator whose all_reduce adds 1 to its result on rank 1."""

    def __init__(self, comm):
        self._comm = comm

    def __getattr__(self, name):
        return getattr(self._comm, name)

    def all_reduce(self, t, *a, **k):
        out = self._comm.all_reduce(t, *a, **k)
        if self._comm.rank == 1 and t.numel():
            with torch.no_grad():
                t[(0,) * t.dim()] += 1
        return out


def _soak_broken(comm, seed, count):
    return soak_rank(_OffByOne(comm), seed, 0, count)


def test_the_soak_reports_a_wrong_result(rank_pool):
    results = rank_pool(2).run(_soak_broken, 12, 300)
    assert results[0]["wrong"] == []
    assert results[1]["wrong"], "an all_reduce off by one went unnoticed"
    assert all("all_reduce" in line and "rank 1" in line for line in results[1]["wrong"])

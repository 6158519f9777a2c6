"""Runs a schedule sequentially on concrete numpy data: the slow, obviously correct executor.

Phases run in order; within a phase each rank's reductions (NOTE [reductions] in
``schedule.py``) run in order and ranks one after another (the checker guarantees the order of
ranks within a phase does not matter). A reduction reads all its sources before it writes. Used by tests to
cross-check the checker and the CPU executor.
"""

from __future__ import annotations

import numpy as np

from .collectives import chunk_lengths
from .schedule import Schedule


def interpret(sched: Schedule, inputs: dict[str, list[np.ndarray]], count: int,
              op=np.add) -> dict[str, list[np.ndarray]]:
    """``inputs[buf][rank]`` are the flat input buffers; returns every buffer of every rank.

    Buffers not given start as NaN (reading one shows up as NaN in the result).
    """
    w = sched.world_size
    state: dict[str, list[np.ndarray]] = {}
    starts: dict[tuple[int, str], list[int]] = {}
    for b in sched.buffers:
        lens = [chunk_lengths(sched, r, b.name, count) for r in range(w)]
        for r in range(w):
            starts[(r, b.name)] = list(np.cumsum([0] + lens[r]))
        if b.name in inputs:
            state[b.name] = [np.array(x, dtype=np.float64) for x in inputs[b.name]]
        else:
            state[b.name] = [np.full(sum(lens[r]), np.nan) for r in range(w)]

    def view(rank, loc):
        s = starts[(rank, loc.buf)]
        return state[loc.buf][rank][s[loc.chunk]:s[loc.chunk + 1]]

    for p in range(len(sched.phases)):
        for r in range(w):
            for red in sched.reductions_of(r, p):
                dst = view(r, red.dst)
                vals = ([dst.copy()] if red.accumulate else []) + \
                    [view(sr, loc).copy() for sr, loc in red.srcs]
                acc = vals[0]
                for v in vals[1:]:
                    acc = op(acc, v)
                dst[:] = acc
    return state

"""Switching what runs CPU collectives (``comm.use_cpu_kernels``) forgets every validated call:
a memoized call names the engine it was validated for, and running it after a switch would use
the old engine (possibly closed)."""

from __future__ import annotations

import pytest

import os

import torch

pytestmark = pytest.mark.interpreter


def _switch_back_and_forth(comm):
    os.environ["TRITON_INTERPRET"] = "1"
    w, r = comm.world_size, comm.rank
    x = torch.arange(4, dtype=torch.float32) + 10 * r
    out = torch.empty(4 * w)
    want = torch.cat([torch.arange(4, dtype=torch.float32) + 10 * q for q in range(w)])
    y = torch.ones(6)
    got = []

    def ran_on(engine, op):
        # a call the Triton kernels ran notes its device call number in its flight record
        # (the kernels' own scratch allocations may be recorded after it)
        rec = next(r for r in reversed(comm.flight.records) if r.op == op)
        return (rec.device is not None) == (engine == "triton")
    for engine in ("triton", "executor", "triton", "executor"):
        comm.use_cpu_kernels(engine)
        for _ in range(2):                    # the second call of each is the memoized one
            out.fill_(-1)
            comm.all_gather(x, out)           # the pair memo
            got.append((engine, "all_gather", torch.equal(out, want),
                        ran_on(engine, "all_gather")))
            y.fill_(1)
            comm.all_reduce(y)                # the in-place memo
            got.append((engine, "all_reduce", bool((y == w).all()),
                        ran_on(engine, "all_reduce")))
    return got


def test_a_memoized_call_follows_the_engine_switch(rank_pool):
    for got in rank_pool(2, "kernels").run(_switch_back_and_forth):
        assert all(ok and where for _, _, ok, where in got), got

"""Grid cap and cooperative launches (NOTE [co-residency]; the cap itself: test_cta_budget.py),
checked without a GPU: on CUDA every collective kernel launch
passes ``launch_cooperative_grid=True`` (so a grid that cannot be co-resident fails at launch
instead of hanging). Triton is imported in a subprocess only (the kernel tests' ranks need it
imported under the interpreter)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tilecomm.backends.triton.context import KernelContext

SCRIPT = r'''
import json, sys, types
import torch
import triton
import triton.language as tl
from triton.runtime.jit import JITFunction

from tilecomm.backends import triton as tb
from tilecomm.backends.triton import registry

calls = []
def record(self, *args, grid, warmup, **kwargs):
    calls.append({"fn": self.fn.__name__, "grid": list(grid), "coop": kwargs.get("launch_cooperative_grid")})
JITFunction.run = record                  # no GPU: record what a launch would compile with

out = {"supported": tb.cooperative_supported()}
registry.load()

# a TritonBackend on a (fake) CUDA device turns cooperative launches on
from tilecomm.backends.triton import TritonBackend
from tilecomm.device import heap as dheap

class FakeHeap:
    rank, world_size, device = 0, 1, torch.device("cuda", 0)
    handle = None
    timeout = 1.0
    timeout_ns = 10**9
    def next_epoch(self):
        return 1

class FakeHost:                           # comm.host of a world of one rank
    def all_gather(self, t):
        return t.reshape(-1)

comm = types.SimpleNamespace(rank=0, world_size=1, timeout=1.0, host=FakeHost())
dheap.DeviceHeap.create = staticmethod(lambda *a, **k: FakeHeap())
be = TritonBackend(comm, "cuda:0")
out["cooperative"] = sorted(be.cooperative)
out["launch_options"] = be.ctx.launch_options
out["max_programs"] = be.ctx.max_programs

from tilecomm.backends.triton.kernels import all_reduce, gather_scatter
x = torch.zeros(4)
all_reduce.one_shot_all_reduce_kernel[(3,)](x, x, x, 4, x, 4, x, x, WORLD=2, BLOCK=128, OP=0,
                                           ACC_F32=0)
gather_scatter.all_gather_ring_kernel[(2,)](x)
out["calls"] = calls
# idempotent: wrapping twice leaves one wrapper
out["again"] = tb.make_cooperative(all_reduce.one_shot_all_reduce_kernel)
print(json.dumps(out))
'''


def test_two_dimensional_grids_stay_within_the_cap_on_an_own_gpu():
    class _Heap:
        rank, world_size = 0, 1
        import torch as _t
        device = _t.device("cpu")

    ctx = KernelContext(_Heap(), host=None, interpret=True)
    ctx.max_programs, ctx.sharing = 132, 1
    assert ctx.programs(10**9) == 132
    assert ctx.programs(10**9, width=8) == 16          # (16, 8): 128 CTAs <= 132 SMs
    assert ctx.programs(10**9, width=200) == 1         # never 0
    assert ctx.launch_options == {}                    # interpreter: plain launches


@pytest.mark.slow
@pytest.mark.compile
def test_cuda_launches_are_cooperative():
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    r = subprocess.run([sys.executable, "-c", SCRIPT], env=env, capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0, r.stderr[-4000:]
    out = json.loads(r.stdout.strip().splitlines()[-1])
    if not out["supported"]:
        pytest.skip("installed triton has no launch_cooperative_grid option")
    assert out["launch_options"] == {"launch_cooperative_grid": True}
    assert "all_reduce.one_shot_all_reduce_kernel" in out["cooperative"]
    assert "gather_scatter.all_gather_ring_kernel" in out["cooperative"]
    assert out["max_programs"] >= 1
    assert [c["coop"] for c in out["calls"]] == [True, True], out["calls"]
    assert out["calls"][0]["grid"] == [3]
    assert out["again"] is False

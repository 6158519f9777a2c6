"""torch.distributed calls through the tilecomm backend onto the GPU kernels (in the Triton
interpreter, on CPU tensors): the path CUDA tensors would take, checked against exact values.

Runs in a fresh interpreter with TILECOMM_CPU_KERNELS=triton and TRITON_INTERPRET=1 (both must
be set before triton is imported, so not in this pytest process).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.interpreter

SCRIPT = r"""
import json, sys
import torch, torch.distributed as dist
sys.path.insert(0, sys.argv[1])
from tests.torch_backend.harness import run_ranks

def body(rank, w):
    assert type(dist.group.WORLD.comm._backend_for_device("cpu")).__name__ == "TritonBackend"
    out = {}
    t = torch.arange(8, dtype=torch.float32) + rank
    dist.all_reduce(t)
    out["all_reduce"] = t.tolist()
    t = torch.arange(6, dtype=torch.bfloat16) * (rank + 1)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    out["all_reduce_max_bf16"] = t.float().tolist()
    o = torch.zeros(4 * w)
    dist.all_gather_into_tensor(o, torch.full((4,), float(rank)))
    out["all_gather_into_tensor"] = o.tolist()
    parts = [torch.zeros(2) for _ in range(w)]
    dist.all_gather(parts, torch.full((2,), float(rank + 1)))
    out["all_gather"] = [p.tolist() for p in parts]
    o = torch.zeros(2)
    dist.reduce_scatter_tensor(o, torch.arange(2 * w, dtype=torch.float32) * (rank + 1))
    out["reduce_scatter_tensor"] = o.tolist()
    t = torch.full((3,), float(rank))
    dist.broadcast(t, src=w - 1)
    out["broadcast"] = t.tolist()
    t = torch.tensor([rank == 0, True])
    dist.broadcast(t, src=0)
    out["broadcast_bool"] = t.tolist()
    o = torch.zeros(2 * w)
    dist.all_to_all_single(o, torch.arange(2 * w, dtype=torch.float32) + 10 * rank)
    out["all_to_all_single"] = o.tolist()
    return out

print(json.dumps(run_ranks(body, 3, timeout=30, wait=400)))
"""


@pytest.mark.slow
def test_torch_calls_run_on_the_kernels():
    root = Path(__file__).resolve().parents[2]
    env = dict(os.environ, TILECOMM_CPU_KERNELS="triton", TRITON_INTERPRET="1")
    proc = subprocess.run([sys.executable, "-c", SCRIPT, str(root)], capture_output=True,
                          text=True, timeout=420, env=env, cwd=root)
    assert proc.returncode == 0, proc.stderr[-3000:]
    res = json.loads(proc.stdout.strip().splitlines()[-1])
    w = 3
    for r, out in enumerate(res):
        assert isinstance(out, dict), out
        assert out["all_reduce"] == [3.0 * i + 3 for i in range(8)]
        assert out["all_reduce_max_bf16"] == [3.0 * i for i in range(6)]
        assert out["all_gather_into_tensor"] == [float(j) for j in range(w) for _ in range(4)]
        assert out["all_gather"] == [[float(j + 1)] * 2 for j in range(w)]
        assert out["reduce_scatter_tensor"] == [6.0 * (2 * r + k) for k in range(2)]
        assert out["broadcast"] == [2.0] * 3
        assert out["broadcast_bool"] == [True, True]
        assert out["all_to_all_single"] == [10.0 * j + 2 * r + k for j in range(w) for k in range(2)]

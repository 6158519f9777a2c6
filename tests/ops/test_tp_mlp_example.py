"""examples/tp_mlp.py under torchrun: the fused sequence-parallel MLP trains with the losses of
the unfused one (all_gather + matmul, matmul + reduce_scatter)."""

from __future__ import annotations

import pytest

import json
import os
import subprocess
import sys

EXAMPLE = os.path.join(os.path.dirname(__file__), "..", "..", "examples", "tp_mlp.py")


@pytest.mark.slow
def test_tp_mlp_fused_and_unfused_losses_agree(tmp_path):
    out = tmp_path / "losses.json"
    env = dict(os.environ, OMP_NUM_THREADS="1")
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone",
                           "--nproc-per-node", "2", EXAMPLE, "--steps", "4", "--json",
                           str(out)], capture_output=True, text=True, timeout=120, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "fused loss" in proc.stdout
    res = json.loads(out.read_text())
    assert len(res["fused"]) == len(res["unfused"]) == 4
    assert res["max_rel_diff"] < 1e-5, res
    assert res["fused"][-1] < res["fused"][0]          # it trains

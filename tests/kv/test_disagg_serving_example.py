"""examples/disagg_serving.py under torchrun on one host: prefill ranks push the paged KV cache
layer by layer to decode ranks, and the tokens they generate are those of one process."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

EXAMPLE = os.path.join(os.path.dirname(__file__), "..", "..", "examples", "disagg_serving.py")


@pytest.mark.slow
@pytest.mark.parametrize("world", [2, 4])
def test_disagg_serving_generates_the_reference_tokens(tmp_path, world):
    out = tmp_path / "serving.json"
    env = dict(os.environ, OMP_NUM_THREADS="1")
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone",
                           "--nproc-per-node", str(world), EXAMPLE, "--gen", "5", "--json",
                           str(out)], capture_output=True, text=True, timeout=90, env=env)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    assert "EQUAL" in proc.stdout, proc.stdout[-2000:]
    res = json.loads(out.read_text())
    assert res["equal"] is True and res["world"] == world
    assert len(res["tokens"]) == 6 and all(len(t) == 5 for t in res["tokens"]), res
    assert res["tokens"] == res["reference"]
    assert res["max_logit_diff"] == 0.0, res          # the same float32 ops: bit for bit
    # both sides count the same transfers; non-contiguous blocks: more than one per
    # (layer, K/V) of a request, some runs coalesced: fewer than one per block
    assert res["transfers"] == res["push_transfers"], res
    assert 6 * 3 * 2 < res["transfers"] < res["block_moves"], res

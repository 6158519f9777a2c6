"""The DDP example under torchrun: tilecomm's loss curve equals Gloo's."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "ddp_train.py"


def _torchrun(backend: str, out: Path, ranks: int = 2, steps: int = 15,
              teardown_abort_ok: bool = False) -> dict:
    env = dict(os.environ, OMP_NUM_THREADS="1")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(ranks),
           "--standalone", str(EXAMPLE), "--backend", backend, "--steps", str(steps),
           "--losses", str(out)]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=env, start_new_session=True)
    try:
        _, err = proc.communicate(timeout=140)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)     # torchrun and its ranks: leave nothing behind
        proc.communicate()
        raise
    if proc.returncode and teardown_abort_ok and out.exists() \
            and "terminate called without an active exception" in err:
        # Gloo's ranks sometimes abort while the group is torn down (about 2 runs in 6 under
        # load here), after rank 0 wrote the losses: the baseline's numbers are complete.
        return json.loads(out.read_text())
    assert proc.returncode == 0, f"{backend}: " + err[-3000:]
    return json.loads(out.read_text())


@pytest.mark.slow
@pytest.mark.timeout(300)     # two torchrun launches; slow when the machine is shared
def test_ddp_loss_curve_matches_gloo(tmp_path):
    ours = _torchrun("tilecomm", tmp_path / "tilecomm.json")
    gloo = _torchrun("gloo", tmp_path / "gloo.json", teardown_abort_ok=True)
    assert len(ours["losses"]) == len(gloo["losses"]) == 15
    for a, b in zip(ours["losses"], gloo["losses"]):
        assert abs(a - b) <= 1e-6 * abs(b), (a, b)
    assert ours["losses"][-1] < 0.7 * ours["losses"][0]     # it trains

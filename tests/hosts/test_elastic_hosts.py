"""Failures across simulated hosts: an abort that reaches every host, a shrink past ranks
spread over the hosts, a grow back across them, and a whole host lost (examples/elastic_ddp.py:
its torchrun and its ranks killed; the survivors train on)."""

from __future__ import annotations

import importlib.util
import json
import re
from pathlib import Path

import pytest

from tilecomm import simhosts

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "elastic_ddp.py"


def test_an_abort_reaches_every_host_then_shrink_and_grow_across_them(shared_hosts):
    out, _ = shared_hosts((2, 2))          # hosts_shrink.py, in the shared launch
    assert len(re.findall(r"aborted after [\d.]+ s, shrank OK", out)) == 4, out[-3000:]
    assert len(re.findall(r"shrank to 2 ranks on 2 hosts OK", out)) == 2, out[-3000:]
    assert len(re.findall(r"left OK", out)) == 2, out[-3000:]
    # then grown back across the hosts by a newcomer forked on the last host
    assert len(re.findall(r"rank \d of 3 on 2 hosts: grew OK", out)) == 3, out[-3000:]


@pytest.mark.timeout(300)
def test_elastic_ddp_survives_the_loss_of_a_host(tmp_path):
    """2 hosts x 2 ranks, host 1 killed (SIGKILL: its torchrun and its ranks) at step 2; the
    survivors' job exits 0, and from step 2 on their losses equal those of a 2-rank run
    started from the state they resumed from."""
    reason = simhosts.available()
    if reason:
        pytest.skip(f"simulated hosts unavailable here: {reason}")
    losses, state = tmp_path / "elastic.json", tmp_path / "state.pt"
    res = simhosts.run([2, 2], [str(EXAMPLE), "--steps", "5", "--kill-host", "1", "--at", "2",
                                "--census", "0.3", "--losses", str(losses), "--ckpt",
                                str(state)],
                       timeout=200, capture=True, keep_going=True)
    assert not res.timed_out, res.output[-4000:]
    assert res.codes[0] == 0 and res.codes[1] == -9, res.output[-4000:]
    got = json.loads(losses.read_text())
    assert [e["lost"] for e in got["events"]] == [[2, 3]], got["events"]
    assert {int(k): v for k, v in got["world_sizes"].items()} == {0: 4, 1: 4, 2: 2, 3: 2, 4: 2}
    spec = importlib.util.spec_from_file_location("elastic_ddp", EXAMPLE)
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    ref_path = tmp_path / "reference.json"
    example.main(["--steps", "5", "--local", "2", "--resume", str(state), "--losses",
                  str(ref_path)])
    ref = json.loads(ref_path.read_text())["losses"]
    assert sorted(map(int, ref)) == list(range(2, 5))
    for step in ref:
        assert abs(got["losses"][step] - ref[step]) <= 1e-6, (step, got["losses"][step],
                                                              ref[step])

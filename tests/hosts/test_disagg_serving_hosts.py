"""examples/disagg_serving.py on two simulated hosts (one rank each): every KV push crosses
hosts (Gloo), and the decode host still generates the tokens of one process."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytestmark = [pytest.mark.multihost, pytest.mark.slow]

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


@pytest.mark.timeout(200)
def test_disagg_serving_across_two_hosts(run_on_hosts, tmp_path):
    path = tmp_path / "serving.json"
    out = run_on_hosts((1, 1), EXAMPLES / "disagg_serving.py", "--gen", "5", "--json", path,
                       timeout=120)
    assert "2 ranks on 2 host(s)" in out and "EQUAL" in out, out[-3000:]
    res = json.loads(path.read_text())
    assert res["equal"] is True and res["hosts"] == 2, res
    assert len(res["tokens"]) == 6 and all(len(t) == 5 for t in res["tokens"]), res
    assert res["max_logit_diff"] == 0.0, res
    assert res["transfers"] == res["push_transfers"] > 0, res

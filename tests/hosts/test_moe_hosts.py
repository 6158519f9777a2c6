"""MoE dispatch/combine across simulated hosts (torchrun per host, tilecomm.simhosts): the
hosts engine's results bit for bit against the reference (combine summed per host, then in
host order), for even and uneven layouts, and gradients through both (autograd)."""

import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "moe"))
import moe_scenarios as S  # noqa: E402
from moe_hosts import CASES  # noqa: E402

SCRIPT = "moe_hosts.py"


def _load(tmp_path, name, world):
    return [torch.load(tmp_path / f"{name}.{r}.pt", weights_only=False) for r in range(world)]


@pytest.mark.timeout(400)
@pytest.mark.parametrize("per_host,cases", [
    ((2, 2), {"bf16": [5, 0, 7, 3], "fp8": [4, 6, 2, 5], "f32": [9, 8, 7, 9]}),
    ((1, 2, 1), {"int32": [6, 3, 0, 4], "grad": [5, 0, 6, 3]}),   # uneven: partners wrap
])
def test_roundtrip_across_hosts_matches_reference(run_on_hosts, tmp_path, per_host, cases):
    world = sum(per_host)
    args = [f"{n}:{','.join(map(str, t))}" for n, t in cases.items()]
    run_on_hosts(per_host, SCRIPT, tmp_path, *args)
    host_of = torch.load(tmp_path / "hosts.0.pt")
    assert len(set(host_of)) == len(per_host)
    for name, tokens in cases.items():
        if name == "grad":
            S.check_grads(_load(tmp_path, name, world), tokens, 2 * world)
            continue
        kw = CASES[name]
        S.check(_load(tmp_path, name, world), tokens, seed=kw["seed"],
                dtype=kw.get("dtype", torch.bfloat16), integer=kw.get("integer", False),
                fp8=kw.get("fp8", False), host_of=host_of)

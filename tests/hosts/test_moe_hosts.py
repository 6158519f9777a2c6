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
from shared_launches import MOE_CASES  # noqa: E402

pytestmark = [pytest.mark.multihost, pytest.mark.slow]


def _load(tmp_path, name, world):
    return [torch.load(tmp_path / f"{name}.{r}.pt", weights_only=False) for r in range(world)]


@pytest.mark.timeout(400)
@pytest.mark.parametrize("per_host", list(MOE_CASES), ids=["2x2", "1+2+1"])
def test_roundtrip_across_hosts_matches_reference(shared_hosts, per_host):
    cases, world = MOE_CASES[per_host], sum(per_host)
    _, tmp_path = shared_hosts(per_host)
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

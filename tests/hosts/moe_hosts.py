"""Run under torchrun on simulated hosts (tests/hosts/test_moe_hosts.py): MoE dispatch and
combine across hosts. Every rank writes its results to ``OUT_DIR/<case>.<rank>.pt`` for the test
to compare with the reference; argv: OUT_DIR, then cases ``name:t0,t1,...``."""

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "moe"))

import tilecomm  # noqa: E402
import moe_scenarios as S  # noqa: E402

CASES = {  # name -> keyword arguments of S.roundtrip beyond the token counts
    "bf16": dict(seed=3),
    "fp8": dict(seed=4, fp8=True),
    "int32": dict(seed=5, dtype=torch.float32, integer=True),
    # float32 sums round, so only this case tells the per-host order from plain rank order
    "f32": dict(seed=6, dtype=torch.float32),
}


def main(out_dir: str, cases: list[str]) -> None:
    comm = tilecomm.init(timeout=30)
    assert comm.layout.num_hosts > 1, comm.layout
    out_dir = Path(out_dir)
    for case in cases:
        name, tokens = case.split(":")
        tokens = [int(v) for v in tokens.split(",")]
        if name == "grad":              # forward and backward (autograd) across hosts
            res = S.grad_roundtrip(comm, tokens, 2 * comm.world_size, "grouped")
        else:
            res = S.roundtrip(comm, tokens, **CASES[name])
        torch.save(res, out_dir / f"{name}.{comm.rank}.pt")
        sys.stdout.write(f"rank {comm.rank} {name} ok\n")
        sys.stdout.flush()
    host_of = [comm.layout.host_of(r) for r in range(comm.world_size)]
    torch.save(host_of, out_dir / f"hosts.{comm.rank}.pt")
    comm.barrier()
    comm.close()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2:])

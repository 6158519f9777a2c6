"""Run under torchrun on simulated hosts (tests/hosts/test_kv_hosts.py): the KV scenarios of
tests/kv/kv_scenarios.py, with the ranks of each request on different hosts (and in one host for
all_pairs)."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "kv"))

import tilecomm  # noqa: E402
import kv_scenarios as S  # noqa: E402


def main(names: list[str]) -> None:
    comm = tilecomm.init(timeout=30)
    assert comm.layout.num_hosts > 1, comm.layout
    for name in names:
        out = getattr(S, name)(comm)
        # one write per line: the ranks of a host share the pipe
        sys.stdout.write(f"rank {comm.rank} {name} ok {out!r}\n")
        sys.stdout.flush()
    comm.barrier()
    comm.close()


if __name__ == "__main__":
    main(sys.argv[1:])

"""Run under torchrun on simulated hosts (tests/hosts/test_hosts.py): several scenarios in one
launch, one after another in the same processes (each starts its own communicator or process
group and closes it), because starting hosts costs seconds. ``hosts_api.py SCENARIO...`` with
scenarios ``collectives`` (hosts_collectives.py), ``torch`` (hosts_torch.py) and those of
hosts_faults.py that leave the ranks alive (``mismatch``, ``splits``, ``shm``)."""

import sys

import hosts_collectives
import hosts_faults
import hosts_torch

RUN = {"collectives": hosts_collectives.main, "torch": hosts_torch.main}


def main(scenarios: list[str]) -> None:
    for s in scenarios:
        if s in RUN:
            RUN[s]()
        elif s in ("mismatch", "splits", "shm"):
            hosts_faults.main(s)
        else:
            raise SystemExit(f"hosts_api.py: unknown scenario {s!r}")


if __name__ == "__main__":
    main(sys.argv[1:])

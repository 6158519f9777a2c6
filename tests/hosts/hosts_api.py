"""Run under torchrun on simulated hosts (tests/hosts/shared_launches.py): several scenarios in
one launch, one after another in the same processes (each starts its own communicator or
process group and closes it, so a second ``tilecomm.init`` in a process is exercised too).

Arguments, in order of execution: ``collectives`` (hosts_collectives.py), ``torch``
(hosts_torch.py), ``mismatch`` / ``splits`` / ``shm`` (hosts_faults.py), ``elastic``
(hosts_shrink.py: an abort and two shrinks the ranks survive), ``kv:NAME,NAME``
(kv_hosts.py), ``moe:OUT_DIR|CASE/CASE`` with CASE = ``name:t0,t1,...`` (moe_hosts.py)."""

import sys

import hosts_collectives
import hosts_faults
import hosts_shrink
import hosts_torch
import kv_hosts
import moe_hosts


def main(scenarios: list[str]) -> None:
    for s in scenarios:
        kind, _, arg = s.partition(":")
        if s == "collectives":
            hosts_collectives.main()
        elif s == "torch":
            hosts_torch.main()
        elif s == "elastic":
            hosts_shrink.main()
        elif s in ("mismatch", "splits", "shm"):
            hosts_faults.main(s)
        elif kind == "kv":
            kv_hosts.main(arg.split(","))
        elif kind == "moe":
            out_dir, _, cases = arg.partition("|")
            moe_hosts.main(out_dir, cases.split("/"))
        else:
            raise SystemExit(f"hosts_api.py: unknown scenario {s!r}")


if __name__ == "__main__":
    main(sys.argv[1:])

"""The inter-host link of this machine: one rail round between simulated hosts, alone.

Stays a script: it times Gloo's rail primitive alone, no tilecomm call, in torchrun
workers on simulated hosts (namespaces), as calibration input for ``tilecomm.sim.hosts``.

What the hierarchical runtime's rail steps are made of (``hier/rails.py``): a round of a fixed
4224-byte header block, then, for payloads over 4096 B, a round of the payload. Each round is
``Rails.pairwise``: every member posts a Gloo send to every other member of its rail group and
a receive from each, then waits for all of them (up to 7x faster than Gloo's ``allgather``
on loopback here, which is why the runtime uses them). This script
times exactly that primitive, on 2 simulated hosts x 2 ranks (``tilecomm.simhosts``: the same
process layout as ``tilecomm bench --hosts 2 -n 4``), with no tilecomm collective around it, so
that ``tilecomm.sim.hosts`` can be calibrated on it and then *predict* the hierarchical bench
rows out of sample. ``--primitive allgather`` times Gloo's ``all_gather`` instead (what the
first calibrations measured).

Two modes per size:

* ``both``: every rank sits on its rail (ranks 0-2 and 1-3) and both rails run at once, as in
  ``hier_rail`` / ``hier_rail_first`` (4 processes on the machine's cores);
* ``one``: only rail 0 (ranks 0 and 2) runs; ranks 1 and 3 sleep in a barrier, as the
  non-leaders of ``hier_leader`` wait.

Usage (root or user namespaces; writes JSON)::

    PYTHONPATH=src python benchmarks/hosts_link.py --json benchmarks/results/hosts_link_2x2.json

Rows: ``{"mode", "bytes", "time_us", "rounds", "iters"}``; ``time_us`` is the median over
rounds of the slowest rank's mean call time; the file records ``primitive`` and ``uptime``
before and after.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

HEADER = 4224                     # hier/rails.py ROUND1: 128-byte header + 4096 B payload
SIZES = (HEADER, 32 << 10, 256 << 10, 2 << 20, 16 << 20, 64 << 20)


def _iters(nbytes: int) -> int:
    return max(3, min(300, (64 << 20) // max(nbytes, 1) // 8))


def worker(out_path: str, rounds: int, sizes: list[int], primitive: str) -> None:
    """One torchrun worker: world group over all ranks, one group per rail."""
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank, w = dist.get_rank(), dist.get_world_size()
    per = int(os.environ["LOCAL_WORLD_SIZE"])
    nh = w // per
    members = [[h * per + c for h in range(nh)] for c in range(per)]
    rails = [dist.new_group(m) for m in members]
    mine = rank % per
    peers = [p for p in members[mine] if p != rank]
    rows = []
    for mode in ("both", "one"):
        active = mode == "both" or mine == 0
        for n in sizes:
            iters = _iters(n)
            src = torch.ones(n, dtype=torch.uint8)
            outs = [torch.empty(n, dtype=torch.uint8) for _ in range(nh)]

            def one_round():
                if primitive == "allgather":
                    dist.all_gather(outs, src, group=rails[mine])
                    return
                # hier/rails.py Rails.pairwise: sends to every other member, then receives
                works = [dist.isend(src, p, group=rails[mine]) for p in peers]
                works += [dist.irecv(o, p, group=rails[mine]) for p, o in zip(peers, outs)]
                for x in works:
                    x.wait()
            times = []
            for r in range(rounds + 1):            # round 0 is the warmup
                dist.barrier()
                if active:
                    t0 = time.perf_counter()
                    for _ in range(iters):
                        one_round()
                    times.append((time.perf_counter() - t0) / iters)
                else:
                    times.append(0.0)
            dist.barrier()
            times = times[1:]
            everyone = [None] * w
            dist.all_gather_object(everyone, times)
            if rank == 0:
                slowest = [max(t[i] for t in everyone) for i in range(rounds)]
                rows.append({"mode": mode, "bytes": n, "time_us": 1e6 * statistics.median(slowest),
                             "rounds": rounds, "iters": iters})
                print(f"{mode:4s} {n:>10d} B  {rows[-1]['time_us']:10.1f} us", flush=True)
    if rank == 0:
        Path(out_path).write_text(json.dumps({"rows": rows, "primitive": primitive}, indent=1))
    dist.barrier()
    dist.destroy_process_group()


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", default="benchmarks/results/hosts_link_2x2.json")
    ap.add_argument("--hosts", type=int, default=2)
    ap.add_argument("--per-host", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--sizes", default=",".join(map(str, SIZES)), help="bytes, comma separated")
    ap.add_argument("--timeout", type=float, default=600)
    ap.add_argument("--primitive", choices=("pairwise", "allgather"), default="pairwise",
                    help="pairwise: the rails' own send/recv rounds (hier/rails.py); "
                         "allgather: Gloo's all_gather")
    a = ap.parse_args(argv)
    from tilecomm import simhosts

    tmp = Path(a.json).with_suffix(".part.json").resolve()
    up0 = os.getloadavg()
    res = simhosts.run([a.per_host] * a.hosts,
                       [str(Path(__file__).resolve()), "--worker", str(tmp), str(a.rounds),
                        a.sizes, a.primitive], timeout=a.timeout)
    up1 = os.getloadavg()
    if not res.ok or not tmp.exists():
        print(f"hosts_link: the simulated hosts failed (exit codes {res.codes})", file=sys.stderr)
        return 1
    data = json.loads(tmp.read_text())
    tmp.unlink()
    data.update({"hosts": a.hosts, "per_host": a.per_host, "cpus": os.cpu_count(),
                 "loadavg_before": up0, "loadavg_after": up1,
                 "command": "PYTHONPATH=src python benchmarks/hosts_link.py " +
                            " ".join(argv if argv is not None else sys.argv[1:])})
    Path(a.json).write_text(json.dumps(data, indent=1) + "\n")
    print(f"wrote {len(data['rows'])} rows to {a.json} (load {up0[0]:.2f} -> {up1[0]:.2f})")
    return 0


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--worker":
        worker(sys.argv[2], int(sys.argv[3]), [int(x) for x in sys.argv[4].split(",")],
               sys.argv[5])
    else:
        raise SystemExit(main())

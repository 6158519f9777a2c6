"""send/recv ping-pong between two simulated hosts, tilecomm against Gloo in the same run.

Stays a script: a ping-pong round trip between ranks 0 and 2 on two simulated hosts
(namespaces) is not a bench case (``tilecomm bench send_recv`` times a ring exchange).

    PYTHONPATH=src python benchmarks/hosts_pingpong.py [--sizes 2,1024,65536] [--iters 200]

Ranks 0 and 2 of 2 hosts x 2 ranks exchange a float32 message back and forth; each row is the
median round trip (us) of one repeat, tilecomm's send/recv (checked: both sides compare what
they send and expect) and Gloo's raw send/recv on the same world group (unchecked).
"""

from __future__ import annotations

import argparse


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="2,1024,65536", help="float32 elements, comma separated")
    ap.add_argument("--iters", type=int, default=200)
    ap.add_argument("--repeats", type=int, default=2)
    a = ap.parse_args(argv)
    from tilecomm.bench.hosts_group import HostsGroup
    from tilecomm.bench.p2p_pingpong import pingpong

    print(f"{'elements':>9} {'tilecomm us':>12} {'gloo us':>8} {'x gloo':>7}")
    with HostsGroup([2, 2], timeout=120) as g:
        for n in (int(s) for s in a.sizes.split(",")):
            for _ in range(a.repeats):
                res = g.run(pingpong, 0, 2, n, a.iters)[0]
                print(f"{n:>9} {res['tilecomm']:>12.0f} {res['gloo']:>8.0f} "
                      f"{res['gloo'] / res['tilecomm']:>7.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""Run under torchrun on simulated hosts (tests/hosts/test_hosts.py): promises across hosts.

Argument ``scenario``: mismatch (count differs between hosts, then within one host, then row
shapes with equal counts on one rank, then all_to_all_v split sizes that disagree across hosts,
then a bad argument on one rank: every rank raises), splits (the row-shape and split-size
cases alone, for uneven hosts, where a rank alone on its host cannot tell its rail partners that
it rejected a call: docs/design.md), shm (nothing of tilecomm left in this host's /dev/shm once
the communicator exists), dies (the last rank exits: every other rank raises CommTimeout naming
it, within the timeout)."""

import os
import sys
import time

import torch

import tilecomm
from tilecomm.errors import CommError, CommMismatch, CommTimeout
from tilecomm.hier.plans import hier_algorithms


def shapes_and_splits(comm) -> None:
    """Row shapes (equal counts) that differ on the last rank, then all_to_all_v split sizes
    that disagree across hosts: every rank raises CommMismatch, and the calls stay in step;
    then a send/recv between hosts of different sizes (both sides raise)."""
    r, w = comm.rank, comm.world_size
    last = w - 1
    # equal element counts, different row shapes on one rank (3 x 4 against 4 x 3)
    rest = (4, 3) if r == last else (3, 4)
    for name, call in (("all_gather", lambda a: comm.all_gather(torch.ones(2, *rest),
                                                               algo=a)),
                       ("all_to_all", lambda a: comm.all_to_all(torch.ones(w, *rest))),
                       ("all_to_all_v", lambda a: comm.all_to_all_v(torch.ones(w, *rest),
                                                                   [1] * w))):
        for algo in (("hier_rail", "hier_leader") if name == "all_gather" else ("auto",)):
            if algo not in hier_algorithms(name, comm.layout) and algo != "auto":
                continue
            try:
                call(algo)
            except CommMismatch as e:
                print(f"rank {r}: rows {name}/{algo}: CommMismatch: {str(e)[:160]}",
                      flush=True)
            else:
                raise AssertionError(f"rank {r}: rows {name}/{algo}: no CommMismatch")
            comm.barrier()
    # split sizes that disagree across hosts (Gloo would silently receive 1 row into a
    # 2-row slot): every rank assembles the split matrix and raises the same error
    recv = [1] * w
    if r == 0:
        recv[last] = 2
    try:
        comm.all_to_all_v(torch.ones(w, 3), [1] * w, recv)
    except CommMismatch as e:
        print(f"rank {r}: splits: CommMismatch: {str(e)[:160]}", flush=True)
    else:
        raise AssertionError(f"rank {r}: splits: no CommMismatch")
    comm.barrier()
    # send/recv between hosts that disagree on the size, below and above the 4 KiB carried
    # in the first message: both sides raise, and the next call still works
    for n in (10, 5000):
        try:
            if r == 0:
                comm.send(torch.ones(n), last)
            elif r == last:
                comm.recv(torch.empty(n + 1), 0)
            else:
                continue
        except CommMismatch as e:
            print(f"rank {r}: p2p {n}: CommMismatch: {str(e)[:160]}", flush=True)
        else:
            raise AssertionError(f"rank {r}: p2p {n}: no CommMismatch")
    # two receives facing each other: both raise at once instead of waiting for the timeout
    if r in (0, last):
        t0 = time.monotonic()
        try:
            comm.recv(torch.empty(4), last if r == 0 else 0)
        except CommMismatch as e:
            assert time.monotonic() - t0 < 4, time.monotonic() - t0
            print(f"rank {r}: p2p recv/recv: CommMismatch: {str(e)[:160]}", flush=True)
        else:
            raise AssertionError(f"rank {r}: p2p recv/recv: no CommMismatch")
    comm.barrier()


def main(scenario: str) -> None:
    comm = tilecomm.init(timeout=8)
    r, w = comm.rank, comm.world_size
    last = w - 1
    if scenario == "mismatch":
        host = comm.topology.host
        for case in ("hosts", "one_rank"):
            n = 10 + host if case == "hosts" else (11 if r == last else 10)
            for algo in ("auto", "hier_leader", "engine"):
                try:
                    comm.all_reduce(torch.ones(n), algo=algo)
                except CommMismatch as e:
                    print(f"rank {r}: {case}/{algo}: CommMismatch: {str(e)[:160]}", flush=True)
                else:
                    raise AssertionError(f"rank {r}: {case}/{algo}: no CommMismatch")
                comm.barrier()
        shapes_and_splits(comm)
        # hier_rail and engine: the refusing rank's partners time out (it cannot know which
        # rails or group its peers wait on: docs/design.md "Across hosts", Limits)
        for algo in ("hier_leader",):
            t0 = time.monotonic()
            try:
                comm.all_reduce(torch.ones(3), op="bogus" if r == last else "sum", algo=algo)
            except (CommError, ValueError) as e:
                print(f"rank {r}: bad op ({algo}): {type(e).__name__}: {str(e)[:160]}",
                      flush=True)
                assert not isinstance(e, CommTimeout), e      # told, not timed out
                assert time.monotonic() - t0 < 4, time.monotonic() - t0
            else:
                raise AssertionError(f"rank {r}: a bad op on rank {last} raised nothing here")
            comm.barrier()
        x = torch.ones(5)
        comm.all_reduce(x)                      # still usable after all that
        assert torch.all(x == w)
        print(f"rank {r}: mismatch OK", flush=True)
    elif scenario == "splits":
        shapes_and_splits(comm)
        x = torch.ones(5)
        comm.all_reduce(x)
        assert torch.all(x == w)
        print(f"rank {r}: splits OK", flush=True)
    elif scenario == "shm":
        comm.barrier()
        left = [f for f in os.listdir("/dev/shm") if f.startswith("tilecomm")]
        assert not left, f"rank {r}: left in /dev/shm: {left}"
        comm.barrier()
        print(f"rank {r}: shm OK", flush=True)
    elif scenario == "dies":
        comm.all_reduce(torch.ones(4))
        if r == last:
            os._exit(0)
        t0 = time.monotonic()
        try:
            for _ in range(3):
                comm.all_reduce(torch.ones(4))
        except CommTimeout as e:
            dt = time.monotonic() - t0
            assert e.missing == (last,), (e.missing, str(e))
            assert dt < 8 + 5, dt
            print(f"rank {r}: dies OK after {dt:.1f}s: {str(e)[:200]}", flush=True)
            time.sleep(2)     # stay until the others have read this rank's error header
            os._exit(0)
        raise AssertionError(f"rank {r}: no CommTimeout after rank {last} died")
    comm.close()


if __name__ == "__main__":
    main(sys.argv[1])

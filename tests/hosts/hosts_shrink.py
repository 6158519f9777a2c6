"""Part of the shared launch of 2 x 2 hosts (hosts_api.py ``elastic``; read by
tests/hosts/test_elastic_hosts.py): two failures the ranks all survive.

1. An abort across hosts: rank 0 aborts from a watchdog thread while every other rank but the
   last waits in an all_reduce for the last one (busy in its own code): every rank, on every
   host, raises CommAborted naming rank 0 well before the timeout (NOTE [stop across hosts]);
   then all of them shrink, excluding nobody, to a communicator that works across the hosts.
2. A shrink whose excluded ranks are spread over the hosts: the last rank of every host leaves
   (alive; it just closes its communicator); the others shrink past them to a communicator
   that still spans the hosts, and run a random mix of calls on it, checked against the
   references.
3. A grow across hosts (``grow_back``).
"""

import threading
import time

import torch

import tilecomm
from tilecomm.soak import soak_rank


def main() -> None:
    comm = tilecomm.init(timeout=30)
    t = torch.ones(32)
    comm.all_reduce(t)

    # 1. abort
    last = comm.world_size - 1
    if comm.rank == 0:
        threading.Timer(0.3, comm.abort, args=("watchdog: no progress",)).start()
    if comm.rank == last:
        time.sleep(1.5)                 # its own code, while the others wait for it
    t0 = time.monotonic()
    try:
        comm.all_reduce(t)
        raise SystemExit(f"rank {comm.rank}: the all_reduce completed after the abort")
    except tilecomm.CommAborted as e:
        assert e.by == 0 and "watchdog: no progress" in str(e), str(e)
        waited = time.monotonic() - t0
    assert waited < 10, waited         # the stop, not the 30 s timeout
    whole = comm.shrink([])
    x = torch.full((100,), float(whole.rank + 1))
    whole.all_reduce(x)
    assert x[0].item() == sum(range(1, comm.world_size + 1)), x[0]
    comm.close()
    print(f"rank {whole.rank}: aborted after {waited:.1f} s, shrank OK")

    # 2. excluded ranks spread over the hosts
    per = whole.topology.local_size
    leaving = [h * per + per - 1 for h in range(whole.topology.num_hosts)]
    if whole.rank in leaving:
        whole.close()
        print(f"rank {whole.rank}: left OK")
    else:
        new = whole.shrink(leaving)
        res = soak_rank(new, 21, 0, 80, auto_only=True)
        assert not res["wrong"], res["wrong"][:5]
        ranks = new.all_gather(torch.tensor([whole.rank])).tolist()
        assert ranks == [r for r in range(whole.world_size) if r not in leaving], ranks
        hosts = new.topology.num_hosts
        whole.close()
        print(f"rank {whole.rank}: shrank to {len(ranks)} ranks on {hosts} hosts OK")
        grow_back(new)


def grow_back(comm) -> None:
    """3. Grow across hosts: the communicator's last rank forks a newcomer on its host (new
    ranks come last, so the last host's ranks stay contiguous); it joins with the ticket, and
    the grown communicator runs a checked mix of calls on every rank."""
    import gc
    import os

    g = comm.grow(1)
    pid = os.fork() if comm.rank == comm.world_size - 1 else None
    if pid == 0:                    # the newcomer
        gc.freeze()                 # what it inherited is never collected here (fault_soak.py)
        code = 1
        try:
            grown = tilecomm.join(g.ticket, 0)
            res = soak_rank(grown, 22, 0, 60, auto_only=True)
            assert not res["wrong"], res["wrong"][:5]
            print(f"newcomer rank {grown.rank} of {grown.world_size} on "
                  f"{grown.topology.num_hosts} hosts: grew OK", flush=True)
            grown.close()
            code = 0
        finally:
            os._exit(code)
    grown = g.join()
    res = soak_rank(grown, 22, 0, 60, auto_only=True)
    assert not res["wrong"], res["wrong"][:5]
    print(f"rank {grown.rank} of {grown.world_size} on {grown.topology.num_hosts} hosts: "
          f"grew OK", flush=True)
    grown.close()
    comm.close()
    if pid:
        _, status = os.waitpid(pid, 0)
        assert status == 0, f"the newcomer exited with status {status}"

"""Run under torchrun on simulated hosts (tests/hosts/test_elastic_hosts.py): a shrink whose
excluded ranks are spread over the hosts. The last rank of every host leaves (alive; it just
closes its communicator); the others shrink past them to a communicator that still spans the
hosts, and run a random mix of calls on it, checked against the references."""

import torch

import tilecomm
from tilecomm.soak import soak_rank

comm = tilecomm.init(timeout=30)
t = torch.ones(32)
comm.all_reduce(t)
per = comm.topology.local_size
leaving = [h * per + per - 1 for h in range(comm.topology.num_hosts)]
if comm.rank in leaving:
    comm.close()
    print(f"rank {comm.rank}: left OK")
else:
    new = comm.shrink(leaving)
    res = soak_rank(new, 21, 0, 80, auto_only=True)
    assert not res["wrong"], res["wrong"][:5]
    ranks = new.all_gather(torch.tensor([comm.rank])).tolist()
    assert ranks == [r for r in range(comm.world_size) if r not in leaving], ranks
    hosts = new.topology.num_hosts
    new.close()
    comm.close()
    print(f"rank {comm.rank}: shrank to {len(ranks)} ranks on {hosts} hosts OK")

"""tilecomm under torchrun: ``torchrun --standalone --nproc-per-node 2 examples/torchrun_all_reduce.py``.

Across (simulated) hosts: ``tilecomm hosts run --hosts 2 --per-host 2 -- examples/torchrun_all_reduce.py``
(or ``torchrun --nnodes 2 --node-rank H ...`` on two machines). Every rank contributes
``rank + 1``; every rank must end with the sum.
"""

import torch

import tilecomm

comm = tilecomm.init(timeout=30)
t = torch.full((4,), float(comm.rank + 1))
comm.all_reduce(t)
want = float(sum(range(1, comm.world_size + 1)))
assert t.tolist() == [want] * 4, t
g = comm.all_gather(torch.tensor([comm.rank]))
assert g.tolist() == list(range(comm.world_size)), g
print(f"rank {comm.rank}/{comm.world_size} ({comm.topology}): all_reduce={t[0].item():g} all_gather={g.tolist()} ok")
comm.close()

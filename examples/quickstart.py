"""Start 4 local ranks and run a few collectives: ``python examples/quickstart.py``."""

import torch

import tilecomm


def work(comm: tilecomm.Communicator):
    x = torch.arange(4, dtype=torch.float32) * (comm.rank + 1)
    comm.all_reduce(x)                                   # in place, sum over ranks
    rows = comm.all_gather(torch.tensor([comm.rank]))    # [0, 1, 2, 3] on every rank
    mine = comm.reduce_scatter(torch.ones(8))            # 2 rows of 4.0 per rank
    sym = comm.alloc(1024)                               # symmetric memory: zero-copy
    sym.fill_(comm.rank)
    comm.all_reduce(sym, algo="two_shot")
    return x.tolist(), rows.tolist(), mine.tolist(), sym[0].item()


if __name__ == "__main__":
    for rank, result in enumerate(tilecomm.launch(work, 4)):
        print(rank, result)

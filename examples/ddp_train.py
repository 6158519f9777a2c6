"""DDP training on CPU with the tilecomm torch.distributed backend (or Gloo, to compare).

    torchrun --nproc-per-node 2 examples/ddp_train.py                    # tilecomm
    torchrun --nproc-per-node 2 examples/ddp_train.py --backend gloo     # the same run on Gloo
    torchrun --nproc-per-node 4 examples/ddp_train.py --losses out.json  # rank 0 writes losses

Every rank trains a small MLP on its own shard of a fixed synthetic regression task; DDP
averages the gradients with all_reduce after each backward. With the same seed, the loss curve
on tilecomm matches Gloo's to floating-point tolerance (tests/torch_backend checks it).
"""

from __future__ import annotations

import argparse
import json
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

import tilecomm  # noqa: F401 - registers the "tilecomm" backend


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--backend", default="tilecomm", help="tilecomm (default) or gloo")
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--batch", type=int, default=32, help="samples per rank per step")
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--losses", help="rank 0 writes {backend, losses, step_ms} as JSON here")
    args = ap.parse_args()

    torch.set_num_threads(1)
    dist.init_process_group(args.backend)
    rank, world = dist.get_rank(), dist.get_world_size()

    torch.manual_seed(0)    # same initial weights and data everywhere; DDP also broadcasts them
    model = torch.nn.Sequential(torch.nn.Linear(64, args.hidden), torch.nn.GELU(),
                                torch.nn.Linear(args.hidden, args.hidden), torch.nn.GELU(),
                                torch.nn.Linear(args.hidden, 1))
    ddp = DDP(model)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.05, momentum=0.9)
    teacher = torch.randn(64, 1)
    data = torch.randn(args.steps, world, args.batch, 64)

    losses, times = [], []
    for step in range(args.steps):
        x = data[step, rank]
        y = torch.sin(x @ teacher / 8)
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        loss = torch.nn.functional.mse_loss(ddp(x), y)
        loss.backward()                    # gradients all_reduced here, bucket by bucket
        opt.step()
        times.append(time.perf_counter() - t0)
        mean = loss.detach().clone()
        dist.all_reduce(mean)              # the loss averaged over ranks, for the curve
        losses.append(mean.item() / world)
    if rank == 0:
        step_ms = sorted(times)[len(times) // 2] * 1e3
        print(f"{args.backend}: {world} ranks, loss {losses[0]:.5f} -> {losses[-1]:.5f}, "
              f"median step {step_ms:.2f} ms")
        if args.losses:
            with open(args.losses, "w") as f:
                json.dump({"backend": args.backend, "world_size": world, "losses": losses,
                           "step_ms": step_ms}, f)
    # every rank is done before any tears its groups down: Gloo aborts a process whose peer
    # closes its connections while it is still in a call (seen 1 run in 4 here without this)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()

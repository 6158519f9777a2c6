"""DDP that survives the loss of ranks: catch the failure, shrink the group, train on.

Across 2 simulated hosts x 2 ranks, host 1 killed (its torchrun and its ranks, SIGKILL) at
step 5; the survivors finish on 2 ranks and their job exits 0::

    tilecomm hosts run --hosts 2 --per-host 2 -- examples/elastic_ddp.py --kill-host 1 --at 5

On one host under ``tilecomm.launch(..., keep_going=True)``, rank 3 of 4 killed at step 5::

    python examples/elastic_ddp.py --local 4 --kill-rank 3 --at 5

The same run without failures, started from a saved state (``--ckpt`` of a run that shrank,
which saves the state its survivors resumed from)::

    python examples/elastic_ddp.py --local 2 --resume STATE.pt

How it recovers: the step's gradients are all_reduced by DDP during ``backward`` and the loss
after it; ``opt.step()`` runs only once both succeeded, so a failure anywhere in the step
leaves every survivor with the weights of the step before. The survivors then agree on who is
gone (a census in the rendezvous store, bounded in time), call ``dist.shrink_group(lost,
shrink_flags=SHRINK_ABORT)`` (tilecomm's ``Communicator.shrink`` underneath), rebuild DDP on
the new default group and redo the step. The global batch stays the same, split over fewer
ranks, so the survivors follow the trajectory a smaller job would have from the same state.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import time
from datetime import timedelta

import torch
import torch.distributed as dist
from torch.distributed import distributed_c10d as c10d
from torch.nn.parallel import DistributedDataParallel as DDP

import tilecomm
from tilecomm import torchrun

GLOBAL_BATCH = 48      # samples per step over all ranks (divisible by 4, 3, 2 and 1)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--hidden", type=int, default=64)
    ap.add_argument("--local", type=int, metavar="N",
                    help="run N ranks on this host with tilecomm.launch (else: under torchrun)")
    ap.add_argument("--kill-rank", type=int, help="(--local) the rank to kill with SIGKILL")
    ap.add_argument("--kill-host", type=int,
                    help="(torchrun) the host (node rank) whose torchrun and ranks to kill")
    ap.add_argument("--at", type=int, default=5, help="the step at whose start to kill")
    ap.add_argument("--timeout", type=float, default=10.0, help="tilecomm's wait bound (s)")
    ap.add_argument("--census", type=float, default=1.0,
                    help="how long the survivors wait for each other to check in (s)")
    ap.add_argument("--losses", help="the first rank writes {losses, events, world_sizes} here")
    ap.add_argument("--ckpt", help="where the survivors save the state they resume from")
    ap.add_argument("--resume", help="start from this saved state (and its step)")
    args = ap.parse_args(argv)
    if args.local:
        results = tilecomm.launch(_local_rank, args.local, args, keep_going=True)
        failed = [r for r, x in enumerate(results) if isinstance(x, Exception)]
        if any(r != args.kill_rank for r in failed):
            raise SystemExit(f"ranks {failed} failed: {results}")
        return
    rank = int(os.environ["RANK"])
    dist.init_process_group("tilecomm", timeout=timedelta(seconds=args.timeout))
    train(rank, args, torchrun.kill_this_host)


def _local_rank(comm, args):
    """One rank under tilecomm.launch: a torch.distributed group of its own (through a store
    rank 0 serves on loopback), then the same training."""
    store = None
    if comm.rank == 0:
        store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    port = comm.exchange([store.port if store else 0])[0][0]
    if store is None:
        store = dist.TCPStore("127.0.0.1", port, is_master=False)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("tilecomm", store=store, rank=comm.rank,
                            world_size=comm.world_size,
                            timeout=timedelta(seconds=args.timeout))
    comm.close()
    train(comm.rank, args, lambda: os.kill(os.getpid(), signal.SIGKILL), store)


def train(rank: int, args, kill, store=None) -> None:
    """Train ``args.steps`` steps; at step ``args.at`` the doomed rank(s) call ``kill``."""
    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, args.hidden), torch.nn.GELU(),
                                torch.nn.Linear(args.hidden, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    teacher = torch.randn(64, 1)
    data = torch.randn(args.steps, GLOBAL_BATCH, 64)
    step = 0
    if args.resume:
        state = torch.load(args.resume)
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["opt"])
        step = state["step"]
    doomed = rank == args.kill_rank if args.local else \
        int(os.environ.get("GROUP_RANK", -1)) == args.kill_host
    ddp = DDP(model)
    losses, events, sizes = {}, [], {}
    attempt = 0
    while step < args.steps:
        if step == args.at and doomed and not args.resume:
            kill()
        world, me = dist.get_world_size(), dist.get_rank()
        share = GLOBAL_BATCH // world
        x = data[step, me * share:(me + 1) * share]
        y = torch.sin(x @ teacher / 8)
        try:
            opt.zero_grad(set_to_none=True)
            loss = torch.nn.functional.mse_loss(ddp(x), y)
            loss.backward()                       # DDP all_reduces the gradients here
            mean = loss.detach().clone()
            dist.all_reduce(mean)
        except Exception as e:  # noqa: BLE001 - a peer failed: recover below
            t0 = time.monotonic()
            attempt += 1
            lost = census(rank, attempt, store, args.census)
            lost_global = sorted(dist.get_process_group_ranks(dist.group.WORLD)[r]
                                 for r in lost)
            if args.ckpt and min(set(range(dist.get_world_size())) - lost) == me:
                torch.save({"model": model.state_dict(), "opt": opt.state_dict(),
                            "step": step}, args.ckpt)
            dist.shrink_group(sorted(lost), shrink_flags=c10d.SHRINK_ABORT)
            ddp = DDP(model)                      # on the new default group
            events.append({"step": step, "lost": sorted(lost), "lost_global": lost_global,
                           "error": type(e).__name__,
                           "recovery_s": round(time.monotonic() - t0, 3),
                           "world_size": dist.get_world_size()})
            continue                              # redo the step on the survivors
        opt.step()                                # only once the whole step succeeded
        losses[step] = mean.item() / world
        sizes[step] = world
        step += 1
    if dist.get_rank() == 0:
        print(f"rank {rank}: {len(losses)} steps, loss {losses[min(losses)]:.5f} -> "
              f"{losses[max(losses)]:.5f}, world sizes {sorted(set(sizes.values()))}, "
              f"recoveries {events}", flush=True)
        if args.losses:
            with open(args.losses, "w") as f:
                json.dump({"losses": losses, "world_sizes": sizes, "events": events}, f)
    dist.barrier()
    if dist.get_rank() == 0 and not args.local:
        lost_hosts = {int(r) // int(os.environ["LOCAL_WORLD_SIZE"])
                      for e in events for r in e["lost_global"]}
        torchrun.check_in_for_lost_agents(len(lost_hosts))
    dist.destroy_process_group()


def census(rank: int, attempt: int, store=None, window: float = 1.0) -> set[int]:
    """The ranks of the current group that are gone: every survivor checks in under this
    attempt's key; whoever has not within ``window`` seconds of the first is lost. Every
    survivor reads the same list (the first to decide writes it)."""
    if store is None:
        store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]),
                              is_master=False, timeout=timedelta(seconds=30))
    s = dist.PrefixStore(f"elastic-census/{attempt}", store)
    world, me = dist.get_world_size(), dist.get_rank()
    s.set(f"in/{me}", str(rank))
    deadline = time.monotonic() + window
    while time.monotonic() < deadline and not all(s.check([f"in/{r}"]) for r in range(world)):
        time.sleep(0.05)
    here = [r for r in range(world) if s.check([f"in/{r}"])]
    # first writer wins: compare_set only sets when the key is absent
    decided = s.compare_set("lost", "", ",".join(str(r) for r in range(world) if r not in here))
    return {int(r) for r in decided.decode().split(",") if r}


if __name__ == "__main__":
    main()

"""Run under torchrun on simulated hosts (tests/hosts/test_hosts.py): the torch.distributed
backend "tilecomm" across hosts, its default group and new_group subsets that span hosts."""

from datetime import timedelta

import torch
import torch.distributed as dist

import tilecomm  # noqa: F401 - registers the backend


def check_group(group, ranks, tag: str) -> int:
    me = dist.get_rank()
    k = len(ranks)
    i = ranks.index(me)
    x = torch.arange(6, dtype=torch.float32) + me
    dist.all_reduce(x, group=group)
    want = sum(torch.arange(6, dtype=torch.float32) + r for r in ranks)
    assert torch.equal(x, want), (tag, x, want)
    outs = [torch.empty(3) for _ in ranks]
    dist.all_gather(outs, torch.full((3,), float(me)), group=group)
    assert [int(o[0]) for o in outs] == ranks, (tag, outs)
    big = torch.arange(4 * k, dtype=torch.float32) * (me + 1)
    out = torch.empty(4)
    dist.reduce_scatter_tensor(out, big, group=group)
    full = sum(torch.arange(4 * k, dtype=torch.float32) * (r + 1) for r in ranks)
    assert torch.equal(out, full[4 * i:4 * i + 4]), (tag, out)
    b = torch.full((5,), float(me))
    dist.broadcast(b, src=ranks[-1], group=group)
    assert torch.all(b == ranks[-1]), (tag, b)
    a2a_in = torch.arange(k * 2, dtype=torch.float32) + 100 * me
    a2a_out = torch.empty(k * 2)
    dist.all_to_all_single(a2a_out, a2a_in, group=group)
    want = torch.cat([torch.arange(k * 2, dtype=torch.float32)[2 * i:2 * i + 2] + 100 * r
                      for r in ranks])
    assert torch.equal(a2a_out, want), (tag, a2a_out, want)
    objs = [None] * k
    dist.all_gather_object(objs, {"rank": me}, group=group)
    assert [o["rank"] for o in objs] == ranks
    dist.barrier(group=group)
    return 6


def main() -> None:
    dist.init_process_group("tilecomm", timeout=timedelta(seconds=30))
    me, w = dist.get_rank(), dist.get_world_size()
    n = check_group(None, list(range(w)), "world")
    # point-to-point between the first and the last rank (different hosts)
    if me == 0:
        dist.send(torch.arange(4, dtype=torch.float32), dst=w - 1)
    elif me == w - 1:
        t = torch.empty(4)
        dist.recv(t, src=0)
        assert torch.equal(t, torch.arange(4, dtype=torch.float32))
    ends = [0, w - 1]
    g1 = dist.new_group(ends)                  # spans hosts
    odd = [r for r in range(w) if r % 2] or [0]
    g2 = dist.new_group(odd)
    if me in ends:
        n += check_group(g1, ends, "ends")
    if me in odd:
        n += check_group(g2, odd, "odd")
    dist.barrier()
    dist.destroy_process_group()
    print(f"rank {me}: torch backend OK ({n} checks)", flush=True)


if __name__ == "__main__":
    main()

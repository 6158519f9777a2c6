"""Run under torchrun on simulated hosts (tests/hosts/test_hosts.py): every collective and
algorithm across hosts against the reference, on random float data and small integers."""

import sys

import torch

import tilecomm
from tilecomm import reference
from tilecomm.hier.plans import hier_algorithms
from tilecomm.hier.rails import Rails


def main() -> None:
    comm = tilecomm.init(timeout=30)
    r, w = comm.rank, comm.world_size
    lay = comm.layout
    assert lay.num_hosts > 1, lay
    g = torch.Generator().manual_seed(1234)
    # every rank builds every rank's inputs from the same seed: the reference needs them all
    def inputs(shape, dtype):
        xs = [torch.randn(shape, generator=g) for _ in range(w)]
        if dtype in (torch.int32, torch.int64):
            xs = [(x * 10).round() for x in xs]
        return [x.to(dtype) for x in xs]

    # the host's own communicator: this host's ranks only, in topology order
    topo, hc = comm.topology, comm.host_comm
    assert hc is not comm and hc.world_size == topo.local_size and hc.rank == topo.local_rank
    x = torch.tensor([float(r + 1)])
    hc.all_reduce(x)
    assert x.item() == sum(p + 1 for p in topo.host_ranks), (x, topo)

    n_checked = 0
    # sizes: one element, a message inside the header round's 4 KiB and one beyond it, for
    # each dtype (the edge cases once, with float32)
    sizes = {torch.float32: (1, 7, 1000, 5000), torch.bfloat16: (7, 5000),
             torch.int64: (7, 1000)}
    for dtype in (torch.float32, torch.bfloat16, torch.int64):
        for n in sizes[dtype]:
            # engine: inside its header round (7 elements) and on the group's own collective
            eng = ["engine"] if n in (7, 5000) and dtype != torch.int64 else []
            ops = ("sum", "max", "avg") if dtype.is_floating_point else ("sum", "min")
            for algo in hier_algorithms("all_reduce", lay) + eng + ["auto"]:
                for op in ops:
                    _check_all_reduce(comm, inputs((n,), dtype), op, algo, "")
                    n_checked += 1
            for algo in hier_algorithms("all_gather", lay) + eng + ["auto"]:
                xs = inputs((n, 2), dtype)
                out = comm.all_gather(xs[r], algo=algo)
                assert torch.equal(out, reference.all_gather(xs)[r]), (algo, n, dtype)
                n_checked += 1
            for algo in hier_algorithms("reduce_scatter", lay) + eng + ["auto"]:
                xs = inputs((w * n,), dtype)
                out = comm.reduce_scatter(xs[r], algo=algo)
                want = reference.reduce_scatter([x.to(torch.float32) for x in xs])[r].to(dtype) \
                    if dtype == torch.bfloat16 else reference.reduce_scatter(xs)[r]
                _close(out, want, dtype, f"reduce_scatter {algo} {dtype} n={n}")
                n_checked += 1
            for root in range(w):
                for algo in ["auto"] + (eng if root == w - 1 else []):
                    xs = inputs((n,), dtype)
                    x = xs[r].clone()
                    comm.broadcast(x, root=root, algo=algo)
                    assert torch.equal(x, xs[root]), ("broadcast", algo, root, n)
                    x = xs[r].clone()
                    comm.reduce(x, root=root, algo=algo)
                    want = reference.reduce(xs, root)[r] if dtype != torch.bfloat16 else (
                        reference.rank_order_reduced(xs) if r == root else xs[r])
                    _close(x, want, dtype, f"reduce {algo} root={root} {dtype} n={n}")
                    n_checked += 2
            xs = inputs((w * n, 3), dtype)
            for algo in hier_algorithms("all_to_all", lay) + eng + ["auto"]:
                out = comm.all_to_all(xs[r], algo=algo)
                assert torch.equal(out, reference.all_to_all(xs)[r]), ("all_to_all", algo, n)
                n_checked += 1
            counts = [[(i * 3 + j * 5 + n) % 4 for j in range(w)] for i in range(w)]
            xs = [torch.randn(sum(counts[i]), 2, generator=g).to(dtype) for i in range(w)]
            out = comm.all_to_all_v(xs[r], counts[r])
            assert torch.equal(out, reference.all_to_all_v(xs, counts)[r]), ("a2av", n)
            out2 = comm.all_to_all_v(xs[r], counts[r], [counts[j][r] for j in range(w)])
            assert torch.equal(out2, out)
            n_checked += 3
            # the blocks to other hosts as one all_to_all with split sizes (CUDA's path, which
            # avoids NCCL sends and receives facing each other), here on Gloo
            Rails.grouped_devices = ("cuda", "cpu")
            try:
                ys = inputs((w * n, 3), dtype)
                got = comm.all_to_all(ys[r], algo="hier_direct")
                assert torch.equal(got, reference.all_to_all(ys)[r]), ("grouped a2a", n)
                got = comm.all_to_all_v(xs[r], counts[r], algo="hier_direct")
                assert torch.equal(got, out), ("grouped a2av", n)
            finally:
                Rails.grouped_devices = ("cuda",)
            n_checked += 2
    # large calls: several pieces inside each host, odd counts (a padded tail on the rails)
    for dtype, n in ((torch.float32, 1_000_003), (torch.bfloat16, 1_500_001)):
        for algo in hier_algorithms("all_reduce", lay) + ["engine"]:
            for op in ("sum", "avg"):
                _check_all_reduce(comm, inputs((n,), dtype), op, algo, "large ")
                n_checked += 1
    # symmetric tensors, send/recv within and across hosts, barrier
    y = comm.alloc((64,), torch.float32)
    y.fill_(r)
    comm.all_reduce(y)
    assert torch.all(y == sum(range(w))), y
    # sizes around the 4 KiB carried inside the first message across hosts (hier/p2p.py)
    for dtype, n in ((torch.float32, 0), (torch.float32, 10), (torch.float32, 1024),
                     (torch.float32, 1025), (torch.bfloat16, 5000), (torch.int64, 3)):
        msgs = [torch.randn(n, generator=torch.Generator().manual_seed(p)).mul(100).to(dtype)
                for p in range(w)]
        for peer_shift in (1, w - 1):
            dst, src = (r + peer_shift) % w, (r - peer_shift) % w
            if r % 2 == 0:
                comm.send(msgs[r], dst)
                got = comm.recv(torch.empty(n, dtype=dtype), src)
            else:
                got = comm.recv(torch.empty(n, dtype=dtype), src)
                comm.send(msgs[r], dst)
            assert torch.equal(got, msgs[src]), (dtype, n, src)
            n_checked += 1
    comm.barrier()
    comm.close()
    print(f"rank {r}: {n_checked} checks OK on {lay.describe()}", flush=True)


def _check_all_reduce(comm, xs, op, algo, label):
    """all_reduce of this rank's ``xs[rank]`` against the reference (bf16: rank-order)."""
    x = xs[comm.rank].clone()
    comm.all_reduce(x, op=op, algo=algo)
    dtype = x.dtype
    want = reference.all_reduce(xs, op)[comm.rank] if dtype != torch.bfloat16 \
        else reference.rank_order_reduced(xs, op)
    _close(x, want, dtype, f"{label}all_reduce {algo} {op} {dtype} n={x.numel()}")


def _close(got, want, dtype, what):
    if dtype.is_floating_point and dtype != torch.bfloat16:
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5, msg=what)
    elif dtype == torch.bfloat16:
        # hierarchical sums round twice (inside the host, then across hosts): 2 bf16 ulps
        torch.testing.assert_close(got.float(), want.float(), rtol=2e-2, atol=6e-2, msg=what)
    else:
        assert torch.equal(got, want), what


if __name__ == "__main__":
    sys.exit(main())

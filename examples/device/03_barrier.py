"""Tutorial 03: barriers, among all ranks and among a subset.

    TRITON_INTERPRET=1 python examples/device/03_barrier.py [world_size]
    python examples/device/03_barrier.py [world_size]

``gather_then_barrier``: every rank puts its ``src`` into row ``rank`` of every rank's
``rows`` (an all-gather written by the senders), then calls ``lang.barrier``. After the
barrier every row is complete: the barrier's signals are releases and its waits acquires, so
it orders memory as well as time. Each rank then copies the rows to a local ``out``.

``subset_barrier``: only the even ranks take part (``group`` is a bit mask of ranks); odd
ranks launch the kernel but skip it. Members count arrivals with ``signal_add`` on a counter
held by the lowest member, which shows the other way to signal: a counter several ranks bump.

What it teaches:

* ``barrier(pad, slot0, epoch, heap, WORLD, group)`` uses WORLD slots from ``slot0`` on
  every member and a larger epoch for every call on the same slots.
* A barrier synchronizes programs with the same id across ranks: each program that calls it
  needs its own slot range (here ``slot0 = pid * WORLD``).
"""

import sys

import numpy as np
import torch
import triton
import triton.language as tl

import tilecomm
from tilecomm.device import DeviceHeap
from tilecomm.device import lang


@triton.jit
def gather_then_barrier(src, rows, out, pad, n, heap, epoch, WORLD: tl.constexpr,
                        BLOCK: tl.constexpr):
    pid = tl.program_id(0)
    offs = pid * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    rank = lang.my_rank(heap)
    for p in tl.static_range(WORLD):
        lang.put(rows + rank * n, src, offs, mask, p, heap)
    if lang.barrier(pad, pid * WORLD, epoch, heap, WORLD):
        for q in tl.static_range(WORLD):
            tl.store(out + q * n + offs, tl.load(rows + q * n + offs, mask=mask), mask=mask)


@triton.jit
def subset_barrier(pad, arrivals, heap, epoch, group, WORLD: tl.constexpr):
    rank = lang.my_rank(heap)
    if ((group >> rank) & 1) != 0:
        lang.signal_add(pad, WORLD, 1, 0, heap)       # one more arrival at rank 0's counter
        ok = lang.barrier(pad, 0, epoch, heap, WORLD, group)
        if ok & (rank == 0):
            tl.store(arrivals, lang.read_signal(pad, WORLD))


COMPILE = [
    (gather_then_barrier, {"src": "*i32", "rows": "*i32", "out": "*i32", "pad": "*i64",
                           "n": "i32", "heap": "*i64", "epoch": "i64"},
     {"WORLD": 8, "BLOCK": 512}),
    (subset_barrier, {"pad": "*i64", "arrivals": "*i64", "heap": "*i64", "epoch": "i64",
                      "group": "i64"}, {"WORLD": 4}),
]


def run(comm, n=100, block=32, rounds=2):
    w, r = comm.world_size, comm.rank
    heap = DeviceHeap.create(comm)
    src = heap.alloc(n, torch.int32)
    rows = heap.alloc((w, n), torch.int32)
    grid = (triton.cdiv(n, block),)
    pad = heap.signal_pad(grid[0] * w)
    out = torch.zeros((w, n), dtype=torch.int32, device=heap.device)
    expect = np.stack([np.arange(n, dtype=np.int32) * 7 + 100000 * q for q in range(w)])
    for k in range(rounds):
        src.copy_(torch.from_numpy(expect[r] + k))
        heap.barrier()
        gather_then_barrier[grid](src, rows, out, pad, n, heap.handle, heap.next_epoch(), WORLD=w,
                                  BLOCK=block)
        heap.check("03_barrier.gather_then_barrier")
        np.testing.assert_array_equal(out.cpu().numpy(), expect + k)
        heap.barrier()        # nobody writes rows again before everyone has read them

    # subset: even ranks only; rank 0 holds the arrival counter in slot WORLD of its pad
    evens = sum(1 << q for q in range(0, w, 2))
    spad = heap.signal_pad(w + 1)
    arrivals = torch.zeros(1, dtype=torch.int64, device=heap.device)
    for k in range(1, rounds + 1):
        subset_barrier[(1,)](spad, arrivals, heap.handle, k, evens, WORLD=w)
        heap.check("03_barrier.subset_barrier")
        members = len(range(0, w, 2))
        if r == 0:   # all k-th adds precede the k-th barrier; k+1-th ones may have started
            assert members * k <= arrivals.item() < members * (k + 1), (k, arrivals.item())
    heap.barrier()
    return int(arrivals.item()) if r == 0 else None


def main(world_size=4):
    res = tilecomm.launch(run, world_size)
    print(f"{world_size} ranks: gathered rows exact; rank 0 counted {res[0]} subset arrivals")
    print("ok")


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 4)

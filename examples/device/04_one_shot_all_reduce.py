"""Tutorial 04: a fused collective -- one-shot all_reduce in a single kernel.

    TRITON_INTERPRET=1 python examples/device/04_one_shot_all_reduce.py [world_size]
    python examples/device/04_one_shot_all_reduce.py [world_size]

Each program takes one BLOCK of the vector. It pushes its block of ``x`` into row ``rank``
of every rank's symmetric ``staging`` (put), meets the same program of every other rank in a
barrier (so all rows have arrived, and are visible), and sums the WORLD rows in a fixed order
(rank 0 first), so every rank computes bit-identical results. One synchronization per call,
WORLD-1 remote writes per element: the latency-bound choice for small messages.

Reusing one staging buffer in the next call would race: a fast rank could start call k+1
and overwrite row ``rank`` of a slow rank that is still summing call k. So the kernel
alternates two staging halves by epoch parity: call k+2 (same half as call k) writes a peer's
half only after the barrier of call k+1, which that peer reaches only after its call-k kernel
finished. That is the pattern the collective kernels use (docs/device-api.md).
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
def one_shot_all_reduce(x, out, staging, pad, n, heap, epoch, WORLD: tl.constexpr,
                        BLOCK: tl.constexpr):
    pid = tl.program_id(0)
    offs = pid * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    rank = lang.my_rank(heap)
    half = staging + (epoch % 2) * (WORLD * n)        # alternate halves between calls
    for p in tl.static_range(WORLD):
        lang.put(half + rank * n, x, offs, mask, p, heap)
    if lang.barrier(pad, pid * WORLD, epoch, heap, WORLD):
        acc = tl.load(half + offs, mask=mask)
        for q in tl.static_range(1, WORLD):
            acc += tl.load(half + q * n + offs, mask=mask)
        tl.store(out + offs, acc, mask=mask)


COMPILE = [(one_shot_all_reduce,
            {"x": "*fp32", "out": "*fp32", "staging": "*fp32", "pad": "*i64", "n": "i32",
             "heap": "*i64", "epoch": "i64"}, {"WORLD": 8, "BLOCK": 1024})]


def run(comm, n=200, block=64, rounds=3):
    w, r = comm.world_size, comm.rank
    heap = DeviceHeap.create(comm)
    grid = (triton.cdiv(n, block),)
    staging = heap.alloc((2, w, n), torch.float32)
    pad = heap.signal_pad(grid[0] * w)
    for k in range(rounds):
        # integers in float32: the sum is exact in any order
        xs = [np.arange(n, dtype=np.float32) * (q + 1) + k for q in range(w)]
        x = torch.from_numpy(xs[r]).to(heap.device)
        out = torch.empty_like(x)
        one_shot_all_reduce[grid](x, out, staging, pad, n, heap.handle, heap.next_epoch(), WORLD=w,
                                  BLOCK=block)
        heap.check("04_one_shot_all_reduce")
        np.testing.assert_array_equal(out.cpu().numpy(), np.sum(xs, axis=0))
    return rounds


def main(world_size=4):
    tilecomm.launch(run, world_size)
    print(f"{world_size} ranks: one_shot all_reduce exact")
    print("ok")


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 4)

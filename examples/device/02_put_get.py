"""Tutorial 02: put and get of blocks around a ring, one signal per program.

    TRITON_INTERPRET=1 python examples/device/02_put_get.py [world_size]
    python examples/device/02_put_get.py [world_size]

``ring_put``: each program copies its BLOCK of ``src`` into the *next* rank's ``inbox``
(``lang.put``), then raises its own slot (slot = program id) on that rank; then it waits for
the *previous* rank's program with the same id to do the same for it.

``ring_get``: each program reads its BLOCK of the *previous* rank's ``src`` (``lang.get``).
A get reads whatever is there: the peer's data must be ready before (here the host barrier
after the host filled ``src``) and must not change until every reader is done (the barrier
after).

What it teaches:

* ``put(dst, src, offs, mask, peer, heap)``: local ``src[offs]`` -> peer's ``dst[offs]``;
  ``get(dst, src, offs, mask, peer, heap)``: peer's ``src[offs]`` -> local ``dst[offs]``.
* One slot per program: program ``i`` waits only on program ``i`` of a peer. Under the
  interpreter a grid's programs run one after another, so a program must never wait on a
  later program of its own launch; one slot per program keeps them independent.
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
def ring_put(src, inbox, pad, n, heap, epoch, WORLD: tl.constexpr, BLOCK: tl.constexpr):
    pid = tl.program_id(0)
    offs = pid * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    rank = lang.my_rank(heap)
    nxt = (rank + 1) % WORLD
    prv = (rank + WORLD - 1) % WORLD
    lang.put(inbox, src, offs, mask, nxt, heap)
    lang.signal_set(pad, pid, epoch, nxt, heap)     # release: the put is visible
    lang.wait_ge(pad, pid, epoch, prv, heap)        # acquire: prv's put to me is


@triton.jit
def ring_get(src, out, n, heap, WORLD: tl.constexpr, BLOCK: tl.constexpr):
    pid = tl.program_id(0)
    offs = pid * BLOCK + tl.arange(0, BLOCK)
    prv = (lang.my_rank(heap) + WORLD - 1) % WORLD
    lang.get(out, src, offs, offs < n, prv, heap)


_SIG = {"src": "*fp32", "inbox": "*fp32", "pad": "*i64", "n": "i32", "heap": "*i64",
        "epoch": "i64"}
COMPILE = [
    (ring_put, _SIG, {"WORLD": 4, "BLOCK": 256}),
    (ring_get, {"src": "*fp32", "out": "*fp32", "n": "i32", "heap": "*i64"},
     {"WORLD": 8, "BLOCK": 1024}),
]


def data(rank, n):
    """What rank ``rank`` sends: distinct, exactly representable float32 values."""
    return (np.arange(n, dtype=np.float32) + 1000 * rank + 0.5).astype(np.float32)


def run(comm, n=300, block=64, rounds=2):
    """Both kernels ``rounds`` times; checks exactly against numpy; returns the checked count."""
    w, r = comm.world_size, comm.rank
    heap = DeviceHeap.create(comm)
    src = heap.alloc(n, torch.float32)
    inbox = heap.alloc(n, torch.float32)
    pad = heap.signal_pad(triton.cdiv(n, block))
    out = torch.empty(n, dtype=torch.float32, device=heap.device)
    grid = (triton.cdiv(n, block),)
    expect = data((r - 1) % w, n)
    for _ in range(rounds):
        src.copy_(torch.from_numpy(data(r, n)))
        inbox.zero_()
        out.zero_()
        heap.barrier()                      # every src written, every inbox cleared
        epoch = heap.next_epoch()
        ring_put[grid](src, inbox, pad, n, heap.handle, epoch, WORLD=w, BLOCK=block)
        heap.check("02_put_get.ring_put")
        np.testing.assert_array_equal(inbox.cpu().numpy(), expect)
        ring_get[grid](src, out, n, heap.handle, WORLD=w, BLOCK=block)
        heap.barrier()                      # nobody changes src while a peer may read it
        np.testing.assert_array_equal(out.cpu().numpy(), expect)
    return rounds * 2 * n


def main(world_size=2):
    checked = tilecomm.launch(run, world_size)
    print(f"{world_size} ranks: {sum(checked)} values put and got, all exact")
    print("ok")


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 2)

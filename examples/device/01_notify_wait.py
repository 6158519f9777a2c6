"""Tutorial 01: notify and wait between two ranks (ping-pong).

    TRITON_INTERPRET=1 python examples/device/01_notify_wait.py     # CPU, shared-memory heap
    python examples/device/01_notify_wait.py                        # GPU(s), CUDA IPC heap

Rank 0 writes a message straight into rank 1's copy of a symmetric buffer ``box`` and raises
signal slot 0 of rank 1's pad to ``epoch``. Rank 1 waits for that slot, doubles the message
and writes the answer into rank 0's ``box``, raising slot 1 of rank 0's pad. Rank 0 waits
for the answer.

What it teaches:

* A kernel that communicates takes one argument for it, ``heap``: the device handle
  (``DeviceHeap.handle``), which holds this rank's number (``lang.my_rank``), every rank's
  heap address, the wait bound and the error record.
* ``lang.peer_ptr(ptr, peer, heap)`` turns a pointer into *my* copy of a symmetric tensor
  into a pointer to *peer's* copy. Plain ``tl.store`` through it writes peer memory.
* ``lang.signal_set`` is a release: the stores before it are visible to whoever acquires the
  new value. ``lang.wait_ge`` is that acquire, and it is bounded: it returns False after
  ``heap.timeout`` seconds, records who waited on whom, and ``heap.check`` raises
  CommTimeout.
* Signals are epochs: launch k waits for ``>= k``, so pads never need to be reset.
"""

import sys

import torch
import triton
import triton.language as tl

import tilecomm
from tilecomm.device import DeviceHeap
from tilecomm.device import lang


@triton.jit
def ping_pong(box, pad, heap, epoch, N: tl.constexpr):
    offs = tl.arange(0, N)
    rank = lang.my_rank(heap)
    if rank == 0:
        msg = offs.to(tl.int64) * 10 + epoch
        tl.store(lang.peer_ptr(box, 1, heap) + offs, msg)     # write into rank 1's box
        lang.signal_set(pad, 0, epoch, 1, heap)               # then notify rank 1
        lang.wait_ge(pad, 1, epoch, 1, heap, site=2)          # wait for the answer
    elif rank == 1:
        if lang.wait_ge(pad, 0, epoch, 0, heap, site=1):
            msg = tl.load(box + offs)                         # my copy: rank 0 wrote it
            tl.store(lang.peer_ptr(box, 0, heap) + offs, msg * 2)
            lang.signal_set(pad, 1, epoch, 0, heap)


#: kernels and representative signatures for tilecomm.device.compile_check
COMPILE = [(ping_pong, {"box": "*i64", "pad": "*i64", "heap": "*i64", "epoch": "i64",
                        "N": "constexpr"}, {"N": 16})]


def run(comm, n=16, rounds=2):
    """Run ``rounds`` ping-pongs on ranks 0 and 1 (other ranks idle); returns rank 0's boxes."""
    heap = DeviceHeap.create(comm)
    box = heap.alloc(n, torch.int64)
    pad = heap.signal_pad(2)
    seen = []
    for _ in range(rounds):
        epoch = heap.next_epoch()
        ping_pong[(1,)](box, pad, heap.handle, epoch, N=n)
        heap.check("01_notify_wait.ping_pong")
        if comm.rank == 0:
            expect = (torch.arange(n, dtype=torch.int64) * 10 + epoch) * 2
            got = box.cpu()
            assert torch.equal(got, expect), f"epoch {epoch}: {got.tolist()} != {expect.tolist()}"
            seen.append(got.tolist())
        heap.barrier()
    return seen


def main(world_size=2):
    results = tilecomm.launch(run, world_size)
    print(f"rank 0 got the answers {results[0]}")
    print("ok")


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 2)

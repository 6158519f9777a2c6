"""A launcher whose ranks never return, for tests that kill it (tests/runtime/
test_launcher_signals.py). Run as ``python launcher_program.py WORLD``.

Prints ``LAUNCHER <pid>`` and one ``RANK <r> <pid>`` line per rank. Rank 0 makes a few
all_reduces and then computes in a Python loop forever (a user computation that never calls
tilecomm); the other ranks wait in their next all_reduce, which times out only after
``TILECOMM_TIMEOUT`` (set long by the tests).
"""

from __future__ import annotations

import os
import sys

import torch

import tilecomm


def body(comm):
    os.write(1, f"RANK {comm.rank} {os.getpid()}\n".encode())   # one write: lines never mix
    t = torch.ones(8)
    for _ in range(3):
        comm.all_reduce(t)
    if comm.rank == 0:
        x = 0
        while True:          # busy, holding the GIL between bytecodes only
            x = (x * 31 + 7) % 1_000_003
    while True:
        comm.all_reduce(t)


if __name__ == "__main__":
    os.write(1, f"LAUNCHER {os.getpid()}\n".encode())
    tilecomm.launch(body, int(sys.argv[1]))

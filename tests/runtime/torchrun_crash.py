"""Run under torchrun (tests/runtime/test_trace_analyze.py): rank 2 fails after the first
all_reduce; torchrun then stops the other ranks (SIGTERM) while they wait for it."""

import torch

import tilecomm

comm = tilecomm.init(timeout=60)
t = torch.ones(8)
comm.all_reduce(t)
if comm.rank == 2:
    raise SystemExit(3)
comm.all_reduce(t)

"""The torch backend's calls land in the flight recorder (they go through the Communicator)."""

from __future__ import annotations

import json
import os
import signal

import torch
import torch.distributed as dist


from .harness import run_ranks


def _torch_calls(rank, world):
    t = torch.ones(5)
    dist.all_reduce(t)
    dist.broadcast(t, 0)
    os.kill(os.getpid(), signal.SIGUSR1)       # dump now, from inside the process group
    doc = json.loads(open(os.path.join(os.environ["TILECOMM_DEBUG_DIR"],
                                       f"flight-rank{rank}.json")).read())
    return [(x["op"], x["bytes"], x["state"]) for c in doc["comms"] for x in c["records"]]


def test_the_torch_backend_calls_are_recorded(debug_dir):
    got = run_ranks(_torch_calls, 2, timeout=20)
    for ops in got:
        assert ops[-2:] == [("all_reduce", 20, "completed"), ("broadcast", 20, "completed")]

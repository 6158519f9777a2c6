"""Helpers for jobs under torchrun that survive the loss of a host.

torchrun's agent stops every rank of its host when one fails, so under torchrun the unit a job
loses is a host; these two functions are the host-level failure and what the surviving host's
torchrun needs afterwards (``examples/elastic_ddp.py``, ``tilecomm.fault_soak``).
"""

from __future__ import annotations

import os
import signal
import time
from datetime import timedelta

from . import procfs


def kill_this_host() -> None:
    """From a rank under torchrun: kill this host's torchrun agent and every rank it started
    (SIGKILL), as when a machine is lost. Local rank 0 does it (and dies); the other ranks
    wait to be killed. torchrun's agent stops all its ranks when one fails, so under torchrun
    the unit that is lost is a host: this is the failure to test jobs against."""
    if int(os.environ.get("LOCAL_RANK", 0)):
        time.sleep(3600)
        return
    agent = os.getppid()
    for pid in os.listdir("/proc"):
        if pid.isdigit() and int(pid) != os.getpid() and procfs.parent(int(pid)) == agent:
            _sigkill(int(pid))
    _sigkill(agent)
    _sigkill(os.getpid())


def _sigkill(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def check_in_for_lost_agents(n: int) -> None:
    """Let this host's torchrun exit when its workers are done: a torchrun agent whose
    workers succeeded waits (300 s, not settable from the command line) in an exit barrier
    for every agent of the job, and a lost host's agent never comes. Check in for it: the
    barrier is a counter in the agent store (PrefixStore(run id) over the TCPStore at
    MASTER_ADDR:MASTER_PORT, key "torchelastic/agent/terminal_state/num_members"; the last
    member sets ".../last_member"), as in torch/distributed/elastic/utils/store.py."""
    agents = int(os.environ.get("GROUP_WORLD_SIZE", 1))
    if n <= 0 or "TORCHELASTIC_RUN_ID" not in os.environ:
        return
    import torch.distributed as dist

    tcp = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]),
                        is_master=False, timeout=timedelta(seconds=30))
    store = dist.PrefixStore(os.environ["TORCHELASTIC_RUN_ID"], tcp)
    prefix = "torchelastic/agent/terminal_state"
    for _ in range(n):
        if store.add(prefix + "/num_members", 1) == agents:
            store.set(prefix + "/last_member", "<val_ignored>")

"""tilecomm as a torch.distributed backend.

Importing ``tilecomm`` (or this module) registers the backend ``"tilecomm"``::

    import tilecomm, torch.distributed as dist
    dist.init_process_group("tilecomm")        # under torchrun, or with rank/world_size/store
    dist.all_reduce(t)                          # runs on tilecomm's shared-memory collectives

It serves CPU tensors. Its ranks may span hosts (``torchrun --nnodes N``): the ranks of a host
share memory, and the hierarchical algorithms run their inter-host legs on Gloo groups
(docs/design.md, "Across hosts"; ``tests/hosts`` runs the backend on simulated hosts, its
default group and ``new_group`` subsets that span them). Every group (``dist.new_group``) gets
a Communicator of its own, with its own symmetric heap on each host. See
``docs/compatibility.md`` for what PyTorch's own test suite says about it.
"""

from __future__ import annotations

import torch.distributed as dist

from .process_group import BACKEND_NAME, ProcessGroupTilecomm, create_process_group


def register() -> None:
    """Register ``"tilecomm"`` with torch.distributed (idempotent)."""
    if BACKEND_NAME.upper() in dist.Backend._plugins:
        return
    dist.Backend.register_backend(BACKEND_NAME, create_process_group, devices=["cpu"])


if dist.is_available():
    register()

__all__ = ["BACKEND_NAME", "ProcessGroupTilecomm", "create_process_group", "register"]

"""tilecomm as a torch.distributed backend.

Importing ``tilecomm`` (or this module) registers the backend ``"tilecomm"``::

    import tilecomm, torch.distributed as dist
    dist.init_process_group("tilecomm")        # under torchrun, or with rank/world_size/store
    dist.all_reduce(t)                          # runs on tilecomm's shared-memory collectives

It serves CPU tensors of processes on one host; every group (``dist.new_group``) gets its own
symmetric heap. See ``docs/compatibility.md`` for what PyTorch's own test suite says about it.
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

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
    _let_shrink_group_take_python_groups()


def _let_shrink_group_take_python_groups() -> None:
    """NOTE [shrink_group]: ``dist.shrink_group`` (PyTorch 2.13) asks the group's backend for
    its shrunk successor (``ProcessGroupTilecomm.shrink``), then wraps what it gets in a new
    ``ProcessGroup`` through ``_register_backend``, which accepts only C++ backends; a Python
    process group cannot be one. So the step that wraps it (``_create_shrunk_process_group``,
    private) is given a front that returns a tilecomm group as the new group itself, named
    and described as torch would, and passes every other backend on unchanged. Feature-
    detected: where torch lacks the step, nothing is changed."""
    from torch.distributed import distributed_c10d as c10d

    make = getattr(c10d, "_create_shrunk_process_group", None)
    if make is None or getattr(make, "tilecomm_front", False):
        return

    def create_shrunk(new_backend, remaining_ranks, metadata, is_default_group):
        if not isinstance(new_backend, ProcessGroupTilecomm):
            return make(new_backend, remaining_ranks, metadata, is_default_group)
        new_backend._set_group_name(metadata["new_group_name"])
        new_backend._set_group_desc("default:shrunken" if is_default_group else
                                    f"{metadata['original_group_name']}:shrunk")
        return new_backend

    create_shrunk.tilecomm_front = True
    c10d._create_shrunk_process_group = create_shrunk


if dist.is_available():
    register()

__all__ = ["BACKEND_NAME", "ProcessGroupTilecomm", "create_process_group", "register"]

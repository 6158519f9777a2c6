"""Which engine runs a fused op: the CPU engine, or the Triton kernels (CUDA tensors, or CPU
tensors with ``comm.cpu_kernels == "triton"``). A module of its own so that the public ops and
their autograd functions both use it without importing each other."""

from __future__ import annotations

import torch

from . import cpu


def engine_for(comm, a):
    """The engine module for ``a``'s device: every rank must pick the same one (the
    descriptor exchange compares it)."""
    if isinstance(a, torch.Tensor) and (a.device.type != "cpu" or comm.cpu_kernels == "triton"):
        from . import kernel
        return kernel
    return cpu

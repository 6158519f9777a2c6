"""What a backend gets of a caller's tensor: the flat view a call's buffers are made of.

A host executor takes flat ``uint8`` numpy arrays over the tensors' memory (:class:`Bytes`), a
kernel backend flat tensors of the call's dtype (:class:`Flat`); :func:`buffer_for` picks the
one a backend takes. A non-contiguous tensor gets a contiguous copy, written back by
``finish``.
"""

from __future__ import annotations

import numpy as np
import torch

from .types import DType, flat_view


class Bytes:
    """Flat ``uint8`` numpy view of a tensor's memory for the backend.

    A non-contiguous tensor gets a contiguous copy (``read``: with its contents); ``finish``
    writes a copy back into the tensor (``write``). ``heap(t)`` may supply the segment bytes
    of a symmetric tensor instead of a view of its block.
    """

    __slots__ = ("tensor", "tmp", "flat", "write")

    def __init__(self, t: torch.Tensor, what: str, read: bool = True, write: bool = True,
                 heap=None):
        self.tensor, self.tmp, self.write = t, None, write
        if heap is not None and t.is_contiguous():
            seg = heap(t)
            if seg is not None:     # see NOTE [call memo] (tilecomm.calls)
                self.flat = seg
                return
        if not t.is_contiguous():
            self.tmp = (t.detach().contiguous() if read else
                        torch.empty_like(t, memory_format=torch.contiguous_format))
            t = self.tmp
        self.flat = flat_view(t).view(torch.uint8).numpy()

    def finish(self) -> None:
        if self.tmp is not None and self.write:
            with torch.no_grad():
                self.tensor.copy_(self.tmp)


def host_tensor(t: torch.Tensor, what: str) -> None:
    if t.device.type != "cpu":
        raise TypeError(f"{what}: point-to-point takes CPU tensors, got one on {t.device}")


class Flat:
    """Flat contiguous torch view of a tensor for kernel backends (``tensor_buffers``); a
    non-contiguous tensor gets a contiguous copy, written back by ``finish`` (``write``)."""

    __slots__ = ("tensor", "tmp", "flat", "write")

    def __init__(self, t: torch.Tensor, what: str, read: bool = True, write: bool = True,
                 heap=None):
        self.tensor, self.tmp, self.write = t, None, write
        if not t.is_contiguous():
            self.tmp = (t.detach().contiguous() if read else
                        torch.empty_like(t, memory_format=torch.contiguous_format))
            t = self.tmp
        self.flat = flat_view(t)

    def finish(self) -> None:
        if self.tmp is not None and self.write:
            with torch.no_grad():
                self.tensor.copy_(self.tmp)


def buffer_for(be, t: torch.Tensor, what: str, read: bool = True, write: bool = True,
            heap=None):
    """The buffer object ``be`` takes: numpy bytes (host executors) or a flat tensor."""
    cls = Flat if be.tensor_buffers else Bytes
    return cls(t, what, read=read, write=write, heap=heap)


def as_tensor(raw: np.ndarray, d: DType) -> torch.Tensor:
    """A torch tensor of dtype ``d`` sharing the memory of the uint8 array ``raw``."""
    if d.numpy is not None:
        return torch.from_numpy(raw.view(d.numpy))
    return torch.from_numpy(raw.view(np.int16)).view(d.torch)

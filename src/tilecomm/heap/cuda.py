"""CUDA symmetric heap: one device buffer per rank, mapped by every rank through CUDA IPC.

Each rank allocates ``nbytes`` of device memory, exports it with PyTorch's CUDA IPC reduction
(``torch.multiprocessing.reductions.reduce_tensor``: a ``cudaIpcMemHandle`` plus the offset of
the block in its allocation), and the handles are exchanged with an all-gather the caller
provides (``exchange(obj) -> [obj of rank 0, ..., obj of rank w-1]``; see
:func:`exchange_via_comm`). Every rank opens every peer's handle, so ``address(r)`` is rank
``r``'s buffer as mapped in this process: the table a kernel needs to rebase a symmetric
pointer (``tilecomm.device.lang.peer_ptr``).

Several processes may share one GPU (each opens the others' handles on the same device; their
kernels time-slice unless MPS is running) and several GPUs of a node work when they are
peer-accessible (NVLink / PCIe P2P): CUDA IPC enables peer access when it opens a handle of
another device.

Why not ``torch.distributed._symmetric_memory``: it is a private API whose rendezvous needs a
torch.distributed process group and (in the releases we read) one device per rank, while the
tests of this project share one GPU between ranks; the IPC path needs neither.

Untested here: development machines have no GPU. Importing this module needs only torch (CPU
builds included); constructing a :class:`CudaHeap` without CUDA raises a clear error.
"""

from __future__ import annotations

import pickle
from typing import Any, Callable

import torch

from ..errors import CommError


def cuda_unavailable_reason() -> str | None:
    """Why a CUDA heap cannot be built in this process, or None if it can."""
    if not torch.cuda.is_available():
        if torch.version.cuda is None:
            return f"torch {torch.__version__} is a CPU-only build (no CUDA support)"
        return "torch has CUDA support but sees no GPU (driver missing or CUDA_VISIBLE_DEVICES)"
    return None


class CudaHeap:
    """``nbytes`` of device memory per rank on ``device``; every rank maps every buffer.

    Collective: every rank constructs it with the same ``nbytes`` (checked). ``buffer(r)``
    is rank ``r``'s buffer as a ``uint8`` tensor in this process, ``address(r)`` its address.
    """

    def __init__(self, rank: int, world_size: int, nbytes: int,
                 exchange: Callable[[Any], list], device: torch.device | str | int | None = None):
        why = cuda_unavailable_reason()
        if why is not None:
            raise CommError(f"CudaHeap: {why}; run device kernels on the CPU heap under "
                            f"TRITON_INTERPRET=1 instead (tilecomm.device.DeviceHeap.create("
                            f"comm, device='cpu'))")
        from torch.multiprocessing.reductions import reduce_tensor

        if device is None:
            device = torch.device("cuda", rank % torch.cuda.device_count())
        self.device = torch.device(device)
        if self.device.type != "cuda":
            raise ValueError(f"CudaHeap: device must be a CUDA device, got {self.device}")
        self.rank, self.world_size, self.nbytes = rank, world_size, int(nbytes)
        torch.cuda.set_device(self.device)
        self._local = torch.zeros(self.nbytes, dtype=torch.uint8, device=self.device)
        torch.cuda.synchronize(self.device)   # zeros visible before any peer maps the buffer
        rebuild, args = reduce_tensor(self._local)
        infos = exchange((self.nbytes, self.device.index, rebuild, args))
        sizes = sorted({n for n, _, _, _ in infos})
        if len(sizes) > 1:
            raise CommError(f"CudaHeap: ranks asked for different sizes {sizes}")
        self._buffers: list[torch.Tensor] = []
        for r, (_, _, fn, a) in enumerate(infos):
            # our own handle cannot be opened in the process that exported it: use the tensor
            self._buffers.append(self._local if r == rank else fn(*a))
        self._addresses = [b.data_ptr() for b in self._buffers]

    def buffer(self, rank: int) -> torch.Tensor:
        return self._buffers[rank]

    def address(self, rank: int) -> int:
        return self._addresses[rank]

    def close(self) -> None:
        """Drop the peer mappings (closing their IPC handles) and this rank's buffer.
        Synchronize first: a kernel still running may use them."""
        if self._buffers:
            torch.cuda.synchronize(self.device)
        self._buffers.clear()


def exchange_via_comm(comm) -> Callable[[Any], list]:
    """An all-gather of picklable objects over a (CPU) :class:`tilecomm.Communicator`."""

    def exchange(obj: Any) -> list:
        data = pickle.dumps(obj)
        sizes = comm.all_gather(torch.tensor([len(data)], dtype=torch.int64))
        width = int(sizes.max())
        buf = torch.zeros(width, dtype=torch.uint8)
        buf[:len(data)] = torch.frombuffer(bytearray(data), dtype=torch.uint8)
        rows = comm.all_gather(buf).view(comm.world_size, width)
        return [pickle.loads(rows[r, :int(sizes[r])].numpy().tobytes())
                for r in range(comm.world_size)]

    return exchange

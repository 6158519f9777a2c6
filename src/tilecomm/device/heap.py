"""What a kernel needs from the symmetric heap: symmetric tensors, signal pads, the table of
peer base addresses, the error buffer and the wait bound.

``DeviceHeap.create(comm)`` picks the implementation:

* :class:`ShmDeviceHeap` (CPU, for ``TRITON_INTERPRET=1``): tensors come from ``comm.alloc``
  (the POSIX shared-memory heap that every rank already maps), and ``bases[r]`` is the address
  of rank ``r``'s segment in this process. Same offset in every segment = same object.
* :class:`CudaDeviceHeap` (GPU): a :class:`tilecomm.heap.cuda.CudaHeap` buffer per rank,
  shared by CUDA IPC; ``bases[r]`` is rank ``r``'s buffer as mapped in this process. The CPU
  communicator carries the handle exchange and host-side barriers.

A kernel gets ``heap.handle`` (:mod:`tilecomm.device.handle`: the rank, the peer base table,
the error record and the wait bound, in one int64 tensor) and symmetric tensors (data and
signal pads); after it, the host calls ``heap.check("kernel name")``. This module does not
import triton.
"""

from __future__ import annotations

import abc
import os
from typing import Sequence

import numpy as np
import torch

from ..errors import CommError
from ..heap.allocator import HeapAllocator
from ..settings import settings
from . import errors as _errors
from . import handle as _handle

#: bytes at the start of a CUDA heap buffer kept for the abort word (allocations stay aligned)
ABORT_BYTES = 256


def interpreted() -> bool:
    """True when Triton kernels of this process run in the interpreter (TRITON_INTERPRET)."""
    return os.environ.get("TRITON_INTERPRET", "0").lower() in ("1", "true", "yes", "on")


def require_interpreter(what: str) -> None:
    """Before kernels run on CPU tensors: turn the Triton interpreter on if triton is not
    imported yet (it reads TRITON_INTERPRET once, at import), else raise
    :class:`~tilecomm.CommError` if it was imported without it. ``what`` names the caller
    in the message ("the fused ops", ...)."""
    import sys

    if "triton" not in sys.modules:
        os.environ["TRITON_INTERPRET"] = "1"
    elif not interpreted():
        from ..errors import CommError
        raise CommError(f"{what} run kernels on CPU tensors in the Triton interpreter, but "
                        f"triton was imported without TRITON_INTERPRET=1; set it before "
                        f"importing triton")


class DeviceHeap(abc.ABC):
    """Symmetric memory for device kernels (see the module docstring).

    NOTE [device abort]
        Every rank's symmetric memory holds an abort word at the same place (the shared-memory
        heap: a slot of the control block; the CUDA heap: the first 8 bytes of the buffer,
        which the allocator never hands out), and the handle points this rank's waits at its
        own (``handle.ABORT``). ``comm.abort()`` on any rank writes 1 + its rank into every
        rank's abort word (``abort``, called through ``comm.host.on_stop``); every device wait
        polls it beside the error word, so a kernel waiting on a peer ends within a poll
        slice and records ABORTED, which ``check`` raises as ``DeviceAborted`` (a
        CommAborted) naming the rank that aborted. The word is never cleared: an aborted
        communicator takes no more calls.
    """

    rank: int
    world_size: int
    device: torch.device
    #: int64[BASES + world_size] on ``device``: what kernels take (tilecomm.device.handle)
    handle: torch.Tensor
    #: int64[world_size] on ``device``: heap base address of every rank in this process (a
    #: view of ``handle``)
    bases: torch.Tensor
    #: int64[ERR_WORDS] on ``device``: the error record of bounded waits (local to this rank;
    #: a view of ``handle``)
    errors: torch.Tensor

    def __init__(self, rank: int, world_size: int, timeout: float | None):
        self.rank, self.world_size = rank, world_size
        self._timeout = 0.0
        self.timeout = settings().device_timeout if timeout is None else timeout
        self._epoch = 0

    def _make_handle(self, bases: Sequence[int], abort_words: Sequence[int] | None = None,
                     comm=None) -> None:
        """Build ``handle`` (and its views ``bases``, ``errors``) once the subclass knows every
        rank's heap base and its device; ``abort_words``: every rank's abort word address in
        this process (NOTE [device abort]), written by :meth:`abort`, which ``comm``'s stop
        calls."""
        self.handle = _handle.make_handle(self.rank, bases, self.timeout_ns, self.device)
        self.bases = _handle.bases_of(self.handle)
        self.errors = _handle.errors_of(self.handle)
        self.abort_words = list(abort_words or [])
        if self.abort_words:
            _handle.set_abort_word(self.handle, self.abort_words[self.rank])
            comm.host.on_stop(self.abort)

    def abort(self, by: int) -> None:
        """Cut every device wait of every rank short (NOTE [device abort]): write ``1 + by``
        into every rank's abort word. Any thread; never waits for the device."""
        for addr in self.abort_words:
            self._write_word(addr, by + 1)

    def _write_word(self, address: int, value: int) -> None:
        """Store ``value`` into the int64 at ``address`` (host-visible memory here)."""
        import ctypes

        ctypes.c_int64.from_address(address).value = value

    @property
    def timeout(self) -> float:
        """Seconds a device wait polls before it gives up; setting it writes the handle (the
        kernels launched afterwards see it, no recompilation)."""
        return self._timeout

    @timeout.setter
    def timeout(self, seconds: float) -> None:
        seconds = float(seconds)
        if not seconds > 0:
            raise ValueError(f"timeout must be > 0 seconds, got {seconds}")
        self._timeout = seconds
        if getattr(self, "handle", None) is not None:
            _handle.set_timeout(self.handle, self.timeout_ns)

    @staticmethod
    def create(comm, *, device: str | torch.device | None = None, nbytes: int | None = None,
               timeout: float | None = None) -> "DeviceHeap":
        """The device heap of ``comm``'s rank (collective: all ranks call it).

        ``device``: ``"cpu"`` (shared-memory heap; kernels must run under TRITON_INTERPRET=1),
        ``"cuda"`` / ``"cuda:N"`` (CUDA IPC heap, default device ``cuda:rank % device_count``),
        or None: CPU under the interpreter, else CUDA. ``nbytes``: size of the CUDA heap per
        rank (default 64 MiB; the CPU heap is ``comm``'s). ``timeout``: seconds a device wait
        polls before giving up (default TILECOMM_DEVICE_TIMEOUT).
        """
        if device is None:
            device = "cpu" if interpreted() else "cuda"
        device = torch.device(device)
        if device.type == "cpu":
            return ShmDeviceHeap(comm, timeout=timeout)
        if device.type == "cuda":
            if interpreted():
                raise CommError("DeviceHeap: TRITON_INTERPRET=1 runs kernels on the CPU; the "
                                "interpreter copies CUDA tensors to the host, so peer addresses "
                                "would be wrong. Use device='cpu' under the interpreter.")
            return CudaDeviceHeap(comm, device=device if device.index is not None else None,
                                  nbytes=nbytes or (64 << 20), timeout=timeout)
        raise ValueError(f"DeviceHeap: unsupported device {device}")

    # ---- for kernels ----------------------------------------------------------------------
    @property
    def timeout_ns(self) -> int:
        """The wait bound in nanoseconds (the handle's ``TIMEOUT_NS`` word)."""
        return int(self.timeout * 1e9)

    def next_epoch(self) -> int:
        """1, 2, 3, ...: the epoch of the next launch (every rank counts the same launches)."""
        self._epoch += 1
        return self._epoch

    @property
    def epoch(self) -> int:
        """The epoch of the last launch (host count)."""
        return self._epoch

    def skip_to(self, epoch: int) -> None:
        """Continue the host count from ``epoch`` (never backwards: signals only grow)."""
        self._epoch = max(self._epoch, int(epoch))

    @abc.abstractmethod
    def alloc(self, shape: int | Sequence[int], dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """A zero-filled symmetric tensor (collective: same sizes, same order on all ranks)."""

    def signal_pad(self, slots: int, dtype: torch.dtype = torch.int64) -> torch.Tensor:
        """A zero-filled symmetric pad of ``slots`` signals (int64, or int32)."""
        if dtype not in (torch.int64, torch.int32):
            raise TypeError(f"signal_pad: signals are int64 or int32 (integer atomics are atomic "
                            f"across processes, also in the interpreter), got {dtype}")
        return self.alloc(slots, dtype)

    @abc.abstractmethod
    def address_range(self) -> tuple[int, int]:
        """``[lo, hi)``: the addresses of this rank's symmetric memory (fixed for the heap's
        life); a tensor inside it is read by the peers in place."""

    # ---- host side ------------------------------------------------------------------------
    def check(self, kernel: str) -> None:
        """Raise :class:`~tilecomm.device.errors.DeviceTimeout` (a ``CommTimeout``) if a wait
        of the kernels launched since the last check gave up; clears the record. On CUDA this
        synchronizes with them."""
        _errors.check(self.errors, kernel, timeout=self.timeout)

    def error_words(self) -> list[int]:
        """The error record as it is once the kernels queued so far have finished (on CUDA a
        synchronization of the device; the interpreter's kernels are finished already)."""
        return [int(x) for x in self.errors.detach().cpu().tolist()]

    def poll_error_words(self) -> list[int] | None:
        """The error record without waiting for the device: on CUDA the words of the previous
        poll's asynchronous copy if it has landed (None otherwise), then a new copy is queued
        behind the kernels launched so far. So a record is seen at the second poll after the
        kernel that wrote it, never by blocking."""
        return self.error_words()

    def clear_errors(self) -> None:
        """Zero the error record (after it was reported)."""
        self.errors.zero_()

    @abc.abstractmethod
    def barrier(self) -> None:
        """Host-side barrier of all ranks (after the device work launched so far completed)."""

    def close(self) -> None:
        """Release what the heap holds (symmetric tensors must not be used afterwards)."""

    def __enter__(self) -> "DeviceHeap":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class SymmetricBuffers:
    """Named symmetric uint8 buffers on ``heap`` that grow collectively: every rank asks for
    the same names and sizes in the same order (kernel engines derive them from agreed call
    descriptors). A buffer is replaced by a larger one only after a heap barrier (a peer may
    still read or write the old one); it never shrinks."""

    def __init__(self, heap: DeviceHeap, align: int = 256):
        self.heap, self.align = heap, align
        self._bufs: dict[str, torch.Tensor] = {}

    def get(self, name: str, nbytes: int) -> torch.Tensor:
        """Buffer ``name``: at least ``nbytes`` (rounded up to ``align``) uint8."""
        cur = self._bufs.get(name)
        if cur is not None and cur.numel() >= nbytes:
            return cur
        size = max(-(-nbytes // self.align) * self.align, self.align)
        self.heap.barrier()            # peers may still use the old buffer
        if cur is not None:
            del self._bufs[name]
            free = getattr(self.heap, "free", None)
            if free is not None:
                free(cur)
        t = self._bufs[name] = self.heap.alloc(size, torch.uint8)
        return t


class ShmDeviceHeap(DeviceHeap):
    """Device heap on a CPU communicator's shared-memory heap (kernels: TRITON_INTERPRET=1)."""

    def __init__(self, comm, *, timeout: float | None = None):
        super().__init__(comm.rank, comm.world_size, timeout)
        self.comm = comm
        self.device = torch.device("cpu")
        heap = comm.host.heap
        lay = heap.layout
        at = 8 * (lay.stop + lay.DEVICE_ABORT)
        self._make_handle([heap.segment(r).ctypes.data for r in range(self.world_size)],
                          [heap.segment(r).ctypes.data + at for r in range(self.world_size)],
                          comm)

    def alloc(self, shape, dtype=torch.float32) -> torch.Tensor:
        t = self.comm.alloc(shape, dtype)
        # comm.alloc zeroes the block after its rendezvous: without this barrier a fast peer
        # could put into the block before this rank zeroed it
        self.comm.host.barrier()
        return t

    def barrier(self) -> None:
        self.comm.host.barrier()

    def address_range(self) -> tuple[int, int]:
        return self.comm.host.heap_range

    def peer_view(self, tensor: torch.Tensor, rank: int) -> torch.Tensor:
        """Rank ``rank``'s copy of the symmetric, contiguous ``tensor`` (a view of its shared
        memory), for host-side copies such as the copy-engine variant of the fused ops."""
        return self.comm.peer(tensor, rank)


class CudaDeviceHeap(DeviceHeap):
    """Device heap on a :class:`tilecomm.heap.cuda.CudaHeap` (CUDA IPC between processes);
    ``comm`` (a CPU communicator) exchanges the handles and runs host barriers.

    Symmetric tensors are carved from the buffer by a deterministic first-fit allocator
    (checked across ranks, as ``comm.alloc``); :meth:`free` returns one, :meth:`close` all.
    """

    def __init__(self, comm, *, device=None, nbytes: int = 64 << 20,
                 timeout: float | None = None):
        super().__init__(comm.rank, comm.world_size, timeout)
        from ..heap.cuda import CudaHeap, exchange_via_comm

        self.comm = comm
        self.heap = CudaHeap(comm.rank, comm.world_size, nbytes, exchange_via_comm(comm.host),
                             device=device)
        self.device = self.heap.device
        # the buffer's first ABORT_BYTES hold the abort word (NOTE [device abort])
        self.heap.buffer(self.rank)[:ABORT_BYTES].zero_()
        torch.cuda.synchronize(self.device)
        self._make_handle([self.heap.address(r) for r in range(self.world_size)],
                          [self.heap.address(r) for r in range(self.world_size)], comm)
        self._alloc = HeapAllocator(ABORT_BYTES, nbytes - ABORT_BYTES)

    def alloc(self, shape, dtype=torch.float32) -> torch.Tensor:
        shape = (shape,) if isinstance(shape, int) else tuple(shape)
        itemsize = torch.empty((), dtype=dtype).element_size()
        nbytes = int(np.prod(shape, dtype=np.int64)) * itemsize
        off = self._alloc.alloc(nbytes)
        raw = self.heap.buffer(self.rank)[off:off + nbytes]
        raw.zero_()
        torch.cuda.synchronize(self.device)  # zeroed before the all_gather lets peers write
        offsets = self.comm.host.all_gather(torch.tensor([off], dtype=torch.int64)).tolist()
        if len(set(offsets)) > 1:
            self._alloc.free(off)
            raise CommError(f"DeviceHeap.alloc: heap diverged (offsets {offsets}); allocate and "
                            f"free in the same order on every rank")
        return raw.view(dtype).reshape(shape)

    def _write_word(self, address: int, value: int) -> None:
        """A peer's abort word is device memory mapped by CUDA IPC: written by a copy on a
        stream of its own (torch's streams do not wait for the default stream), so it
        lands while the kernels it must stop are still running."""
        from ..heap.cuda import tensor_at

        if not hasattr(self, "_abort_stream"):
            self._abort_stream = torch.cuda.Stream(self.device)
        with torch.cuda.stream(self._abort_stream):
            tensor_at(address, 8, self.device).view(torch.int64).fill_(value)

    def free(self, tensor: torch.Tensor) -> None:
        """Return ``tensor`` (from :meth:`alloc`) to the heap (same order on every rank)."""
        off = tensor.data_ptr() - self.heap.address(self.rank)
        self._alloc.free(off)

    def barrier(self) -> None:
        torch.cuda.synchronize(self.device)
        self.comm.host.barrier()

    def address_range(self) -> tuple[int, int]:
        base = self.heap.address(self.rank)
        return base, base + self.heap.nbytes

    def peer_view(self, tensor: torch.Tensor, rank: int) -> torch.Tensor:
        """Rank ``rank``'s copy of the symmetric, contiguous ``tensor`` (from :meth:`alloc`),
        as mapped in this process (CUDA IPC), labelled with this rank's device: for
        ``dst.copy_(peer_view(...))``, a cudaMemcpyAsync by the copy engine on the current
        stream. Only for copies: a kernel must use ``lang.peer_ptr``."""
        from ..heap.cuda import tensor_at

        if not tensor.is_contiguous():
            raise ValueError("peer_view: pass a contiguous tensor from DeviceHeap.alloc")
        off = tensor.data_ptr() - self.heap.address(self.rank)
        nbytes = tensor.numel() * tensor.element_size()
        if off < 0 or off + nbytes > self._alloc.size:
            raise ValueError("peer_view: tensor is not in this rank's device heap")
        raw = tensor_at(self.heap.address(rank) + off, nbytes, self.device)
        return raw.view(tensor.dtype).reshape(tensor.shape)

    def error_words(self) -> list[int]:
        torch.cuda.synchronize(self.device)
        self._polling = False
        return [int(x) for x in self.errors.cpu().tolist()]

    def poll_error_words(self) -> list[int] | None:
        words = None
        if getattr(self, "_polling", False):
            if not self._poll_event.query():
                return None                     # the last copy has not landed: ask later
            words = [int(x) for x in self._poll_host.tolist()]
        else:
            if not hasattr(self, "_poll_host"):
                self._poll_host = torch.zeros(_errors.ERR_WORDS, dtype=torch.int64,
                                              pin_memory=True)
                self._poll_event = torch.cuda.Event()
        self._poll_host.copy_(self.errors, non_blocking=True)  # queued behind the kernels
        self._poll_event.record()
        self._polling = True
        return words

    def close(self) -> None:
        self.heap.close()

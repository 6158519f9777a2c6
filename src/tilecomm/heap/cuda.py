"""CUDA symmetric heap: one device buffer per rank, mapped by every rank through CUDA IPC.

Each rank allocates ``nbytes`` of device memory with ``cudaMalloc`` (its own allocation, so
the IPC handle covers exactly the heap), exports it with ``cudaIpcGetMemHandle``, and the
handles are exchanged with an all-gather the caller provides (``exchange(obj) -> [obj of rank
0, ..., obj of rank w-1]``; see :func:`exchange_via_comm`). Every rank opens every peer's
handle, so ``address(r)`` is rank ``r``'s buffer as mapped in this process: the table a
kernel needs to rebase a symmetric pointer (``tilecomm.device.lang.peer_ptr``).

NOTE [one context per rank]: the handles are opened with ``cudaIpcOpenMemHandle(...,
cudaIpcMemLazyEnablePeerAccess)`` through the CUDA runtime (ctypes on libcudart) while *this
rank's* device is current. PyTorch's own path (``reduce_tensor`` / ``rebuild_cuda_tensor``)
switches to the *producer's* device before opening: with every GPU visible each rank then
made a CUDA context on every GPU, the mapping belonged to the peer's device context, and this
rank's device never got peer access to it (lazy peer access is enabled from the current
device to the memory's device, and there it was the same device), so kernels faulted. Here no
other device is ever made current. Before opening a handle of another GPU the rank checks
that it sees that GPU (by UUID, whatever ``CUDA_VISIBLE_DEVICES`` renumbers) and that
``torch.cuda.can_device_access_peer`` holds, and says so in a :class:`CommError` if not.

Several processes may share one GPU (each opens the others' handles on the same device; their
kernels time-slice unless MPS is running) and several GPUs of a node work when they are
peer-accessible (NVLink / PCIe P2P).

Why not ``torch.distributed._symmetric_memory``: it is a private API whose rendezvous needs a
torch.distributed process group and (in the releases we read) one device per rank, while the
tests of this project share one GPU between ranks; the IPC path needs neither.

Importing this module needs only torch (CPU builds included); constructing a
:class:`CudaHeap` without CUDA raises a clear error. The tests fake the runtime
(``tests/kernels/test_cuda_heap.py``); it has not run on a GPU yet.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import glob
import os
import pickle
from typing import Any, Callable

import torch

from ..errors import CommError, NoDeviceError

#: cudaIpcMemLazyEnablePeerAccess
IPC_LAZY_ENABLE_PEER_ACCESS = 1
IPC_HANDLE_BYTES = 64


def cuda_unavailable_reason() -> str | None:
    """Why a CUDA heap cannot be built in this process, or None if it can."""
    if not torch.cuda.is_available():
        if torch.version.cuda is None:
            return f"torch {torch.__version__} is a CPU-only build (no CUDA support)"
        return "torch has CUDA support but sees no GPU (driver missing or CUDA_VISIBLE_DEVICES)"
    return None


class _IpcHandle(ctypes.Structure):
    _fields_ = [("reserved", ctypes.c_char * IPC_HANDLE_BYTES)]


class Cudart:
    """The few CUDA runtime calls the heap needs, through ctypes on the libcudart that torch
    loaded (same runtime, same primary contexts). Every call raises ``CommError`` naming the
    call and the CUDA error."""

    def __init__(self, lib: ctypes.CDLL):
        self.lib = lib
        vp, sz = ctypes.c_void_p, ctypes.c_size_t
        lib.cudaSetDevice.argtypes = [ctypes.c_int]
        lib.cudaGetDevice.argtypes = [ctypes.POINTER(ctypes.c_int)]
        lib.cudaMalloc.argtypes = [ctypes.POINTER(vp), sz]
        lib.cudaFree.argtypes = [vp]
        lib.cudaIpcGetMemHandle.argtypes = [ctypes.POINTER(_IpcHandle), vp]
        lib.cudaIpcOpenMemHandle.argtypes = [ctypes.POINTER(vp), _IpcHandle, ctypes.c_uint]
        lib.cudaIpcCloseMemHandle.argtypes = [vp]
        lib.cudaGetErrorString.argtypes = [ctypes.c_int]
        lib.cudaGetErrorString.restype = ctypes.c_char_p
        for name in ("cudaSetDevice", "cudaGetDevice", "cudaMalloc", "cudaFree",
                     "cudaIpcGetMemHandle", "cudaIpcOpenMemHandle", "cudaIpcCloseMemHandle"):
            getattr(lib, name).restype = ctypes.c_int

    def _ok(self, rc: int, what: str) -> None:
        if rc != 0:
            msg = self.lib.cudaGetErrorString(rc)
            raise CommError(f"CudaHeap: {what} failed: CUDA error {rc} "
                            f"({msg.decode() if msg else '?'})")

    def set_device(self, index: int) -> None:
        self._ok(self.lib.cudaSetDevice(int(index)), f"cudaSetDevice({index})")

    def get_device(self) -> int:
        d = ctypes.c_int(-1)
        self._ok(self.lib.cudaGetDevice(ctypes.byref(d)), "cudaGetDevice")
        return d.value

    def malloc(self, nbytes: int) -> int:
        p = ctypes.c_void_p()
        self._ok(self.lib.cudaMalloc(ctypes.byref(p), int(nbytes)), f"cudaMalloc({nbytes})")
        return int(p.value)

    def free(self, ptr: int) -> None:
        self._ok(self.lib.cudaFree(ctypes.c_void_p(ptr)), "cudaFree")

    def ipc_get_handle(self, ptr: int) -> bytes:
        h = _IpcHandle()
        self._ok(self.lib.cudaIpcGetMemHandle(ctypes.byref(h), ctypes.c_void_p(ptr)),
                 "cudaIpcGetMemHandle")
        return bytes(ctypes.string_at(ctypes.addressof(h), IPC_HANDLE_BYTES))

    def ipc_open(self, handle: bytes) -> int:
        h = _IpcHandle()
        ctypes.memmove(ctypes.addressof(h), bytes(handle), IPC_HANDLE_BYTES)
        p = ctypes.c_void_p()
        self._ok(self.lib.cudaIpcOpenMemHandle(ctypes.byref(p), h, IPC_LAZY_ENABLE_PEER_ACCESS),
                 "cudaIpcOpenMemHandle")
        return int(p.value)

    def ipc_close(self, ptr: int) -> None:
        self._ok(self.lib.cudaIpcCloseMemHandle(ctypes.c_void_p(ptr)), "cudaIpcCloseMemHandle")


_CUDART: Cudart | None = None


def cudart() -> Cudart:
    """The CUDA runtime of this process (the libcudart torch loaded, else one on the path)."""
    global _CUDART
    if _CUDART is None:
        names = []
        major = (torch.version.cuda or "12").split(".")[0]
        names.append(f"libcudart.so.{major}")        # already loaded by torch: same instance
        tdir = os.path.dirname(torch.__file__)
        names += sorted(glob.glob(os.path.join(tdir, "lib", "libcudart*.so*")))
        names += sorted(glob.glob(os.path.join(os.path.dirname(tdir), "nvidia", "cuda_runtime",
                                               "lib", "libcudart.so*")))
        found = ctypes.util.find_library("cudart")
        if found:
            names.append(found)
        errors = []
        for n in names:
            try:
                _CUDART = Cudart(ctypes.CDLL(n))
                break
            except OSError as e:
                errors.append(f"{n}: {e}")
        else:
            raise CommError("CudaHeap: cannot load the CUDA runtime (libcudart) for the IPC "
                            "calls; tried " + "; ".join(errors))
    return _CUDART


class _CudaArray:
    """``__cuda_array_interface__`` over raw device memory (for ``torch.as_tensor``)."""

    def __init__(self, ptr: int, nbytes: int):
        self.__cuda_array_interface__ = {"shape": (int(nbytes),), "typestr": "|u1",
                                         "data": (int(ptr), False), "version": 3,
                                         "strides": None}


def tensor_at(ptr: int, nbytes: int, device: torch.device) -> torch.Tensor:
    """A ``uint8`` tensor over ``nbytes`` of device memory at ``ptr`` (not owned)."""
    return torch.as_tensor(_CudaArray(ptr, nbytes), device=device)


def device_uuid(index: int) -> str:
    """The physical GPU behind ``cuda:index`` in this process (UUID; the PCI address when the
    UUID is not available), the same in every process whatever CUDA_VISIBLE_DEVICES does."""
    p = torch.cuda.get_device_properties(index)
    return str(getattr(p, "uuid", "") or
               f"pci {getattr(p, 'pci_domain_id', 0)}:{getattr(p, 'pci_bus_id', 0)}:"
               f"{getattr(p, 'pci_device_id', 0)}")


class CudaHeap:
    """``nbytes`` of device memory per rank on ``device``; every rank maps every buffer.

    Collective: every rank constructs it with the same ``nbytes`` (checked). ``buffer(rank)``
    is this rank's buffer as a ``uint8`` tensor, ``address(r)`` rank ``r``'s buffer as mapped
    in this process (see NOTE [one context per rank]).
    """

    def __init__(self, rank: int, world_size: int, nbytes: int,
                 exchange: Callable[[Any], list], device: torch.device | str | int | None = None):
        why = cuda_unavailable_reason()
        if why is not None:
            raise NoDeviceError(f"CudaHeap: no CUDA GPU is available on this machine ({why}); "
                                f"run device kernels on the CPU heap under TRITON_INTERPRET=1 "
                                f"instead (tilecomm.device.DeviceHeap.create(comm, "
                                f"device='cpu'))")
        if device is None:
            device = torch.device("cuda", rank % torch.cuda.device_count())
        self.device = torch.device(device)
        if self.device.type != "cuda":
            raise ValueError(f"CudaHeap: device must be a CUDA device, got {self.device}")
        if self.device.index is None:
            self.device = torch.device("cuda", torch.cuda.current_device())
        self.rank, self.world_size, self.nbytes = rank, world_size, int(nbytes)
        local = self.device.index
        rt = self._rt = cudart()
        torch.cuda.set_device(self.device)
        rt.set_device(local)
        self._ptr = rt.malloc(self.nbytes)
        self._opened: list[int] = []
        try:
            self._local = tensor_at(self._ptr, self.nbytes, self.device)
            self._local.zero_()
            torch.cuda.synchronize(self.device)   # zeros visible before any peer maps it
            handle = rt.ipc_get_handle(self._ptr)
            mine = (self.nbytes, handle, device_uuid(local), os.getpid())
            infos = exchange(mine)
            sizes = sorted({int(i[0]) for i in infos})
            if len(sizes) > 1:
                raise CommError(f"CudaHeap: ranks asked for different sizes {sizes}")
            self._addresses = [0] * world_size
            self._peer_device = [local] * world_size
            visible = {device_uuid(i): i for i in range(torch.cuda.device_count())}
            for r, (_, h, key, _pid) in enumerate(infos):
                if r == rank:       # our own handle cannot be opened by its exporter
                    self._addresses[r] = self._ptr
                    continue
                self._peer_device[r] = self._check_peer(r, key, visible, local)
                rt.set_device(local)  # open in this rank's context (NOTE [one context...])
                self._addresses[r] = rt.ipc_open(h)
                self._opened.append(self._addresses[r])
            if rt.get_device() != local:
                raise CommError(f"CudaHeap: the current device changed to {rt.get_device()} "
                                f"while opening the peers' handles (expected {local})")
        except BaseException:
            self._release()
            raise

    def _check_peer(self, r: int, key: str, visible: dict, local: int) -> int:
        """This process's index of rank ``r``'s GPU, after checking it can reach it."""
        j = visible.get(key)
        if j is None:
            cvd = os.environ.get("CUDA_VISIBLE_DEVICES")
            raise CommError(
                f"CudaHeap: rank {self.rank} (cuda:{local}) cannot map rank {r}'s heap: rank "
                f"{r}'s GPU ({key}) is not visible in this process (CUDA_VISIBLE_DEVICES="
                f"{cvd!r}). CUDA IPC between GPUs needs every rank to see every GPU of the "
                f"communicator; pick each rank's GPU with the device index (cuda:rank), not "
                f"by hiding the others")
        if j != local and not torch.cuda.can_device_access_peer(local, j):
            raise CommError(
                f"CudaHeap: rank {self.rank} on cuda:{local} has no peer access to cuda:{j} "
                f"(rank {r}'s GPU): the GPU kernels read peers' memory directly and need "
                f"NVLink or PCIe P2P between every pair of GPUs (check `nvidia-smi topo -p2p "
                f"r`; IOMMU/ACS settings or virtualization often disable P2P). Run the ranks "
                f"on one GPU or on peer-accessible GPUs")
        return j

    def buffer(self, rank: int) -> torch.Tensor:
        """This rank's buffer (``uint8``). Peers' buffers are only addresses (kernels use
        :meth:`address`): a torch tensor on a peer's GPU would make torch switch to it."""
        if rank != self.rank:
            raise ValueError("CudaHeap.buffer: only this rank's buffer is a tensor; use "
                             "address(r) for a peer's mapping")
        return self._local

    def address(self, rank: int) -> int:
        return self._addresses[rank]

    def peer_device(self, rank: int) -> int:
        """This process's CUDA index of rank ``rank``'s GPU."""
        return self._peer_device[rank]

    def _release(self) -> None:
        rt = self._rt
        for p in self._opened:
            try:
                rt.ipc_close(p)
            except CommError:
                pass
        self._opened = []
        if self._ptr:
            self._local = None
            try:
                rt.free(self._ptr)
            except CommError:
                pass
            self._ptr = 0

    def close(self) -> None:
        """Close the peer mappings and free this rank's buffer. Synchronizes first: a kernel
        still running may use them. Tensors of the heap must not be used afterwards."""
        if self._ptr:
            torch.cuda.synchronize(self.device)
        self._release()


def exchange_via_comm(host) -> Callable[[Any], list]:
    """An all-gather of picklable objects over a communicator's host port (``comm.host``:
    ``all_gather`` of a small CPU tensor on the host executor, ``world_size``)."""
    comm = host

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

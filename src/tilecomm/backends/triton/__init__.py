"""Triton backend: collectives on device tensors as fused Triton kernels over a symmetric heap.

``TritonBackend(comm, device)`` runs a :class:`~tilecomm.backends.base.CollectiveCall` whose
buffers are flat torch tensors on ``device`` by looking its ``(collective, algo)`` up in
:data:`registry.KERNELS` and calling the launcher (contract: :mod:`.registry`).

Per call, on every rank:

1. host handshake through the CPU communicator (``rendezvous``): the ranks compare a digest of
   (collective, algo, dtype, count, op, root, rows) -- a mismatch raises ``CommMismatch`` on
   every rank, a rank that rejected its call makes the others raise -- and exchange the heap
   offset of the input, so zero copy is used only when every rank's input is a heap tensor at
   the same offset (``comm.alloc``);
2. a new epoch (``DeviceHeap.next_epoch``), then the launcher (kernels on the current stream);
3. ``DeviceHeap.check``: a device wait that gave up raises ``CommTimeout`` (on CUDA this
   synchronizes with the kernels).

``device="cpu"`` runs the same kernels in the Triton interpreter on the shared-memory heap
(``TILECOMM_CPU_KERNELS=triton``; the tests use it). Importing this module does not import
triton; the kernel families are imported on the first call.
"""

from __future__ import annotations

import sys
import zlib

import numpy as np
import torch

from ...errors import CommError, CommMismatch
from ...types import lookup_dtype
from ..base import Backend, CollectiveCall
from . import registry
from .context import KernelContext, np_of

#: which buffer peers read for each collective (its heap offset travels in the handshake)
SOURCE = {"all_reduce": "buf", "broadcast": "buf", "reduce": "buf"}


def cooperative_supported() -> bool:
    """True when the installed triton launches a kernel cooperatively on request
    (``kernel[grid](..., launch_cooperative_grid=True)``, a CUDA compile option)."""
    try:
        from triton.backends.nvidia.compiler import CUDAOptions
    except Exception:  # noqa: BLE001 - no NVIDIA backend in this triton
        return False
    return "launch_cooperative_grid" in getattr(CUDAOptions, "__dataclass_fields__", {})


def make_cooperative(fn) -> bool:
    """Make every launch ``fn[grid](...)`` of the Triton ``JITFunction`` ``fn`` pass
    ``launch_cooperative_grid=True`` unless the call says otherwise (``fn[grid]`` calls the
    instance's ``run``). Idempotent; True if ``fn`` was changed now."""
    if getattr(fn, "_tilecomm_cooperative", False):
        return False
    run = fn.run

    def run_cooperative(*args, **kwargs):
        kwargs.setdefault("launch_cooperative_grid", True)
        return run(*args, **kwargs)

    fn.run = run_cooperative
    fn._tilecomm_cooperative = True
    return True


def cooperative_launches() -> list[str]:
    """NOTE [co-residency] (context.grid_limits): on CUDA every collective kernel is launched
    cooperatively, so a grid that cannot be resident at once fails at launch (CUDA error
    "too many blocks in cooperative launch") instead of spinning on programs that never get
    an SM. Applies to the ``JITFunction`` objects defined in the registered kernel families
    (their launchers need no change); returns their names. Not in the interpreter (it has
    no such option and runs programs one by one)."""
    from triton.runtime.jit import JITFunction

    names = []
    for fam in registry.FAMILIES:
        name = f"{__package__}.kernels.{fam}"
        mod = sys.modules.get(name)
        if mod is None:
            continue
        for attr, obj in vars(mod).items():
            if isinstance(obj, JITFunction) and getattr(obj, "module", None) == name:
                make_cooperative(obj)
                names.append(f"{fam}.{attr}")
    return names


class _HostComm:
    """The parts of a Communicator a device heap and the launchers need, always on the host
    executor (never dispatched back to a kernel backend)."""

    def __init__(self, comm):
        self._comm = comm
        self.rank, self.world_size = comm.rank, comm.world_size
        self._heap = comm._heap
        self._heap_lo, self._heap_hi = comm._heap_lo, comm._heap_hi
        self.timeout = comm.timeout

    @property
    def _backend(self):
        return self._comm._backend

    def alloc(self, shape, dtype=torch.float32):
        return self._comm.alloc(shape, dtype)

    def barrier(self):
        self._comm._backend.rendezvous("barrier", 0, 0)

    def all_gather(self, t: torch.Tensor) -> torch.Tensor:
        t = t.detach().contiguous().cpu()
        d = lookup_dtype(t.dtype, what="all_gather")
        out = torch.empty((self.world_size * t.numel(),), dtype=t.dtype)
        self._comm._backend.run(CollectiveCall("all_gather", "direct", d, t.numel(),
                                               {"in": np_of(t), "out": np_of(out)}))
        return out.reshape((self.world_size * t.shape[0], *t.shape[1:])) if t.dim() else out


class TritonBackend(Backend):
    """Collectives on tensors of one device through the registered Triton kernels."""

    #: CollectiveCall.buffers hold flat torch tensors of the call's dtype (see base.Backend)
    tensor_buffers = True
    #: the tuner's rule set for algo="auto" (tuner.choose(..., kind=...))
    kind = "gpu"

    def __init__(self, comm, device: str | torch.device = "cuda", *, nbytes: int | None = None,
                 timeout: float | None = None):
        from ...device.heap import DeviceHeap, interpreted
        from ...settings import settings

        self.rank, self.world_size = comm.rank, comm.world_size
        self.host = _HostComm(comm)
        device = torch.device(device)
        if device.type == "cuda" and device.index is None and torch.cuda.is_available():
            device = torch.device("cuda", torch.cuda.current_device())
        self.heap = DeviceHeap.create(self.host, device=device,
                                      nbytes=nbytes or settings().device_heap_bytes,
                                      timeout=timeout)
        self.device = self.heap.device
        self.ctx = KernelContext(self.heap, self.host, interpret=interpreted())
        #: kernels launched cooperatively (CUDA; NOTE [co-residency])
        self.cooperative: list[str] = []
        if self.device.type == "cuda" and not interpreted() and cooperative_supported():
            registry.load()
            self.cooperative = cooperative_launches()
            self.ctx.launch_options = {"launch_cooperative_grid": True}

    # ---- what the Communicator asks before a call ------------------------------------------
    def algorithms(self, collective: str) -> list[str]:
        return registry.supported(collective)

    def check(self, collective: str, algo: str, dtype: torch.dtype, op) -> None:
        registry.lookup(collective, algo, dtype, None if op is None else op.value)

    def alloc(self, shape, dtype=torch.float32) -> torch.Tensor:
        """A zero-filled symmetric tensor on this backend's device (collective)."""
        shape = (shape,) if isinstance(shape, int) else tuple(shape)
        n = int(np.prod(shape, dtype=np.int64))
        return self.heap.alloc(n, dtype).reshape(shape)

    # ---- a call -----------------------------------------------------------------------------
    def run(self, call: CollectiveCall) -> None:
        spec = registry.lookup(call.collective, call.algo, call.dtype.torch,
                               None if call.op is None else call.op.value)
        src = call.buffers.get(SOURCE.get(call.collective, "in"))
        off = self.ctx.heap_offset(src) if src is not None else -1
        desc = (f"{call.collective}|{call.algo}|{call.dtype.name}|{call.count}|"
                f"{call.op.value if call.op else ''}|{call.root}|"
                # all_to_all_v: send_rows legitimately differ between ranks (not in the digest)
                f"{'v' if call.send_rows is not None else ''}")
        digest = zlib.crc32(desc.encode()) & 0x3FFFFFFF
        try:
            offs = self.host._backend.rendezvous(call.collective, digest, off)
        except CommMismatch as e:
            raise CommMismatch(f"{e} (the digest of the call; this rank called {desc})") from None
        zero_copy = off >= 0 and all(o == off for o in offs)
        self.ctx.begin(zero_copy)
        spec.launch(self.ctx, call)
        self.heap.check(f"{call.collective}/{call.algo}")

    # ---- the rest goes to the host backend ---------------------------------------------------
    def reject(self, collective: str, message: str) -> None:
        self.host._backend.reject(collective, message)

    def rendezvous(self, name: str, count: int, extra: int) -> list[int]:
        return self.host._backend.rendezvous(name, count, extra)

    def send(self, data, dtype, numel, peer):
        raise CommError("send on device tensors is not implemented; copy to the CPU")

    def recv(self, out, dtype, numel, peer):
        raise CommError("recv on device tensors is not implemented; copy to the CPU")

    def probe(self, peer: int) -> bool:
        return self.host._backend.probe(peer)

    def close(self) -> None:
        self.heap.close()


__all__ = ["TritonBackend", "KernelContext", "registry"]

"""What a kernel launcher gets: the device heap, signal pad, scratch, staging, epochs.

NOTE [device epochs]: a kernel does not take its epoch as a host argument: it loads it from
``epoch_dev`` (int64[1] on the device, one per context), which the call increments on the
stream before its kernel (``epoch_dev += 1``, a torch in-place add: captured by a CUDA graph
and executed again by every replay). The parity half of a scratch buffer is chosen by the
kernel from that epoch too (``(epoch % 2) * half``, :meth:`KernelContext.halves`), never on
the host. So a replayed graph launches with fresh epochs and alternating halves, as eager
calls do. ``ctx.epoch`` (the host count, ``heap.next_epoch()``) only names calls in errors;
it equals the device epoch in eager mode, and is not advanced while a CUDA graph is
captured (the captured increment does not run then).

See the launcher contract in :mod:`tilecomm.backends.triton.registry`. This module does not
import triton.
"""

from __future__ import annotations

import numpy as np
import torch

from ...device.budget import cta_budget
from ...types import lookup_dtype

#: signal groups allocated up front (``groups * world`` int64 slots); grown on demand
INITIAL_GROUPS = 4096


class KernelContext:
    """One rank's kernel resources, shared by every call of a :class:`TritonBackend`."""

    def __init__(self, heap, host, *, interpret: bool):
        self.heap = heap
        self.host = host                          # comm.host: host collectives, never kernels
        self.rank, self.world_size = heap.rank, heap.world_size
        self.device = heap.device
        self.interpret = interpret
        #: elements per block, and the most programs a launch uses (persistent programs loop
        #: over blocks): small in the interpreter (each program costs a signal exchange and
        #: every op ~0.2 ms), the rank's CTA budget on a GPU (NOTE [CTA budget] in
        #: tilecomm.device.budget: all ranks' grids resident at once)
        self.block = 128 if interpret else 1024
        #: collective on a GPU (the context is built by every rank's TritonBackend): every
        #: rank must launch the same grid, since program i waits for program i of its peers
        self.budget = cta_budget(self.host_all_gather, heap.device, interpret=interpret)
        self.max_programs = self.budget.ctas
        #: ranks sharing this rank's device (the most on any device)
        self.sharing = self.budget.sharing
        #: keyword options every kernel launch of this context takes (cooperative on CUDA, see
        #: :func:`tilecomm.backends.triton.cooperative_launches`)
        self.launch_options: dict = {}
        #: host count of the epochs launched eagerly (names calls in device errors)
        self.epoch = 0
        self._epoch_dev: torch.Tensor | None = None
        #: host epoch when a CUDA graph was first captured since the last :meth:`resync`
        #: (host epochs above it may differ from the device's), or None
        self.exact_upto: int | None = None
        #: a CUDA graph captured kernels of this context: buffers they use must stay alive
        self.graph_captured = False
        self.zero_copy = False
        self._sym_offset = -1
        self._pad = None
        self._scratch: dict[str, torch.Tensor] = {}
        self._range: tuple[int, int] | None = None
        #: the plan kernel's encoded plans of this rank (kernels/plan.py ``encoded``)
        self.encodings: dict = {}

    # ---- per call -------------------------------------------------------------------------
    @property
    def epoch_dev(self) -> torch.Tensor:
        """NOTE [device epochs]: the epoch the kernels load (int64[1] on the device, local to
        this rank; made at the first call, which is a warm-up for graph capture anyway)."""
        t = self._epoch_dev
        if t is None:
            t = self._epoch_dev = torch.full((1,), self.epoch, dtype=torch.int64,
                                             device=self.device)
        return t

    def begin(self, zero_copy: bool) -> None:
        """Called by the backend before each launcher: new epoch (on the device and, unless
        a CUDA graph is being captured, on the host), zero-copy decision."""
        self.zero_copy = zero_copy
        self.advance()

    def next_epoch(self) -> int:
        """A fresh epoch for a second kernel launched by the same call (host count)."""
        self.advance()
        return self.epoch

    def advance(self) -> None:
        """One epoch: ``epoch_dev += 1`` queued on the current stream before the kernel that
        loads it (a CUDA graph captures and replays it), and the host count (not while a
        graph is captured: the captured add runs only at replay)."""
        self.epoch_dev.add_(1)
        if self.capturing():
            self.graph_captured = True
        if not self.capturing():
            self.epoch = self.heap.next_epoch()
        elif self.exact_upto is None:
            self.exact_upto = self.epoch

    def realign(self, exchange) -> int:
        """After a failed call (collective; a synchronization): every rank takes the same epoch,
        above every epoch any rank used, on the host and on the device; stale signals stay
        below it since signals only grow. ``exchange``: the host all-gather of small ints.
        Returns the new epoch."""
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        mine = max(self.epoch, self.heap.epoch, self.device_epoch())
        top = max(r[0] for r in exchange([mine])) + 2
        self.heap.skip_to(top)
        self.epoch = top
        self.epoch_dev.fill_(top)
        self.exact_upto = None
        return top

    def capturing(self) -> bool:
        """True while the current CUDA stream is being captured into a graph."""
        return self.device.type == "cuda" and torch.cuda.is_current_stream_capturing()

    def device_epoch(self) -> int:
        """The device epoch once the queued work is done (a synchronization on CUDA)."""
        return int(self.epoch_dev.item())

    def resync(self) -> int:
        """After CUDA graph replays the device epoch is ahead of the host count: bring the
        host count up to it (call only where the host synchronizes anyway). Returns the
        device epoch."""
        dev = self.device_epoch()
        if dev > self.epoch:
            self.heap.skip_to(dev)
            self.epoch = dev
        self.exact_upto = None
        return dev

    @property
    def handle(self) -> torch.Tensor:
        """The device handle every kernel takes (``DeviceHeap.handle``,
        :mod:`tilecomm.device.handle`): rank, peer bases, error record, wait bound."""
        return self.heap.handle

    # ---- launch geometry ------------------------------------------------------------------
    def programs(self, n: int, block: int | None = None, width: int = 1) -> int:
        """Programs for ``n`` elements (at least 1, at most ``max_programs``). ``width``: CTAs
        the launch makes per program (a ``(P, W)`` grid has ``width=W``); the whole grid
        (``P * width`` CTAs) stays within ``max_programs``, so it is co-resident (see
        NOTE [CTA budget]; on CUDA it is launched cooperatively, which checks that)."""
        b = block or self.block
        limit = max(1, self.max_programs // max(1, int(width)))
        return max(1, min(limit, -(-int(n) // b)))

    # ---- symmetric memory -----------------------------------------------------------------
    def signals(self, groups: int) -> torch.Tensor:
        """The int64 signal pad with at least ``groups * world_size`` slots (collective when it
        grows; a new pad starts at zero, below every epoch, so growing needs no reset)."""
        need = max(int(groups), 1) * self.world_size
        if self._pad is None or self._pad.numel() < need:
            size = max(need, INITIAL_GROUPS * self.world_size)
            if self._pad is not None:
                self._retire(self._pad)
            self._pad = self.heap.signal_pad(size)
        return self._pad

    def scratch(self, name: str, numel: int, dtype: torch.dtype) -> torch.Tensor:
        """A persistent symmetric 1-D tensor of at least ``numel`` elements of ``dtype`` for
        ``name`` (contents undefined). Growing it is collective: every rank reaches the same
        size in the same call, as calls match."""
        itemsize = dtype_size(dtype)
        nbytes = max(int(numel), 1) * itemsize
        buf = self._scratch.get(name)
        if buf is None or buf.numel() < nbytes:
            nbytes = max(nbytes, 4096, 0 if buf is None else 2 * buf.numel())
            nbytes = -(-nbytes // 256) * 256
            if buf is not None:
                del self._scratch[name]
                self._retire(buf)
            buf = self.heap.alloc(nbytes, torch.uint8)
            self._scratch[name] = buf
        return buf[: (buf.numel() // itemsize) * itemsize].view(dtype)[: max(int(numel), 1)]

    def staged(self, name: str, t: torch.Tensor) -> torch.Tensor:
        """The symmetric tensor peers read ``t`` (flat, local) from in this call: ``t`` itself
        when ``zero_copy`` (every rank passed a heap tensor at the same offset), else a copy
        into half ``epoch % 2`` of scratch ``name`` (rule 3 of the contract). The half is
        chosen on the host: eager calls only; the kernel families stage inside the kernel
        into :meth:`halves` instead (NOTE [device epochs])."""
        if self.zero_copy:
            return t
        half = self.half(name, t.numel(), t.dtype)
        half.copy_(t)
        return half

    def halves(self, name: str, numel: int, dtype: torch.dtype) -> tuple[torch.Tensor, int]:
        """Scratch ``name`` as two parity halves of at least ``numel`` elements each:
        ``(base, half)``, ``base`` a ``dtype`` view of both halves, ``half`` the elements
        from one half to the next (a multiple of 256 bytes). The kernel uses half
        ``epoch % 2`` of the epoch it loads: ``base + (epoch % 2) * half`` (NOTE [device
        epochs]; what :meth:`half` picks on the host, and a CUDA graph replay cannot)."""
        itemsize = dtype_size(dtype)
        nbytes = max(int(numel), 1) * itemsize
        self.scratch(name, 2 * nbytes + 256, torch.uint8)
        full = self._scratch[name]
        cap = (full.numel() // 2) // 256 * 256
        return full[:2 * cap].view(dtype), cap // itemsize

    def half(self, name: str, numel: int, dtype: torch.dtype) -> torch.Tensor:
        """Half ``epoch % 2`` of scratch ``name`` (``numel`` elements), chosen on the host from
        the host epoch: eager calls only (a CUDA graph replay would reuse it; kernels take
        :meth:`halves` and choose on the device).

        The halves sit at fixed offsets (0 and half the buffer), not at offsets that depend on
        this call's size: a peer may still be reading the other half from the previous call,
        which had another size. The buffer only grows (with a barrier) when a call needs more.
        """
        itemsize = dtype_size(dtype)
        nbytes = max(int(numel), 1) * itemsize
        self.scratch(name, 2 * nbytes + 256, torch.uint8)
        full = self._scratch[name]
        cap = (full.numel() // 2) // 256 * 256        # each half, aligned for any dtype
        p = self.epoch % 2
        return full[p * cap:p * cap + nbytes].view(dtype)[:int(numel)]

    def _retire(self, t: torch.Tensor) -> None:
        """Drop a symmetric tensor once no peer can still use it (collective)."""
        if self.graph_captured:
            # a captured graph holds this buffer's address: freeing it would make replays
            # write into whatever is allocated there next
            from ...errors import CommError
            raise CommError("a GPU collective needs more scratch or signal slots than when a "
                            "CUDA graph captured collectives of this communicator; growing "
                            "would free memory the graph uses. Warm up with the largest "
                            "sizes before capturing")
        self.heap.barrier()
        free = getattr(self.heap, "free", None)
        if free is not None:
            free(t)

    def heap_offset(self, t: torch.Tensor) -> int:
        """Offset of ``t``'s data in this rank's heap, or -1 if it is not in the heap."""
        if t.device != self.device or t.numel() == 0:
            return -1
        lo, hi = self.heap_range()
        ptr = t.data_ptr()
        end = ptr + t.numel() * t.element_size()
        return ptr - lo if lo <= ptr and end <= hi else -1

    def heap_range(self) -> tuple[int, int]:
        """``[lo, hi)`` addresses of this rank's symmetric memory (fixed for the heap's life)."""
        if self._range is None:
            self._range = self._heap_range()
        return self._range

    def _heap_range(self) -> tuple[int, int]:
        return self.heap.address_range()

    # ---- host helpers ---------------------------------------------------------------------
    def host_all_gather(self, values) -> list[list[int]]:
        """Every rank's list of ints (same length everywhere), through the host communicator."""
        arr = torch.tensor([int(v) for v in values], dtype=torch.int64)
        out = self.host.all_gather(arr)
        return out.reshape(self.world_size, -1).tolist()


_ITEMSIZE: dict = {}


def dtype_size(dtype: torch.dtype) -> int:
    """Bytes per element of ``dtype`` (cached: no tensor made per call)."""
    n = _ITEMSIZE.get(dtype)
    if n is None:
        n = _ITEMSIZE[dtype] = torch.empty((), dtype=dtype).element_size()
    return n


def np_of(t: torch.Tensor) -> np.ndarray:
    """Flat uint8 numpy view of a CPU tensor (for the host executor)."""
    return t.detach().reshape(-1).view(torch.uint8).numpy()


__all__ = ["KernelContext", "lookup_dtype"]

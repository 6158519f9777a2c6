"""Kernel engine of the fused ops: the persistent Triton GEMMs of
:mod:`tilecomm.backends.triton.kernels.overlap_gemm` on a :class:`~tilecomm.device.DeviceHeap`.

CUDA tensors run them on the GPU (CUDA IPC heap); CPU tensors run them in the Triton
interpreter on the shared-memory heap when the communicator runs CPU collectives on kernels
(``comm.use_cpu_kernels("triton")`` / TILECOMM_CPU_KERNELS=triton): slow, for testing the GPU
code without a GPU.

Per call, on every rank: the descriptor handshake (:mod:`.checks`: errors on every rank), then
(all_gather_matmul) a copy of ``a_shard`` into this rank's chunk of the symmetric ``g`` and
one kernel launch (``copy="kernel"``) or the copy-engine pipeline of :func:`_gather_by_stream`
(``copy="stream"``), or (matmul_reduce_scatter) one launch; then ``heap.check`` (on CUDA a
synchronization: a device wait that gave up raises ``CommTimeout`` naming the op, the peer
and the epoch). Buffers and pads are symmetric, grown collectively when a call needs more
(after a device barrier: a peer may still read the old one); epochs are counted per op.
"""

from __future__ import annotations

import weakref

import torch

from ..device.budget import cta_budget
from ..settings import settings
from . import checks

_ENGINES: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()
_ALIGN = 256


def _device_ok(d: torch.device) -> bool:
    return d.type in ("cpu", "cuda")


def _kernels(device: torch.device):
    if device.type == "cpu":        # the interpreter must be on before triton is imported
        from ..device.heap import require_interpreter
        require_interpreter("the fused ops")
    from ..backends.triton.kernels import overlap_gemm
    return overlap_gemm


class _Engine:
    """One rank's heap, buffers, pads and epochs for one device type (collective creation)."""

    def __init__(self, comm, device: torch.device):
        from ..device import DeviceHeap
        from ..device.heap import SymmetricBuffers

        self.k = _kernels(device)
        # the tensors' own GPU; as large as the GPU collectives' heap (TILECOMM_DEVICE_HEAP_BYTES:
        # the 64 MiB default of DeviceHeap.create is too small for TP-sized chunks)
        self.heap = DeviceHeap.create(comm, device=device,
                                      nbytes=settings().device_heap_bytes)
        self.interpret = device.type == "cpu"
        #: persistent GEMM programs per launch: the rank's CTA budget (NOTE [CTA budget] in
        #: tilecomm.device.budget: a rank's programs wait for its peers' chunks, so every
        #: rank's grid must be resident at once, also when ranks share a GPU)
        self.programs = cta_budget(comm.exchange, self.heap.device,
                                   interpret=self.interpret).ctas
        self._bufs = SymmetricBuffers(self.heap, _ALIGN)
        self._epochs = {"ag": 0, "rs": 0}

    def side_stream(self):
        """The CUDA stream of the copy-engine variant's copies (created once)."""
        if getattr(self, "_side", None) is None:
            self._side = torch.cuda.Stream(self.heap.device)
        return self._side

    def next_epoch(self, kind: str) -> int:
        self._epochs[kind] += 1
        return self._epochs[kind]

    def symmetric(self, name: str, nbytes: int) -> torch.Tensor:
        """A symmetric uint8 buffer of at least ``nbytes`` (collective when it grows)."""
        return self._bufs.get(name, nbytes)

    def halves(self, name: str, elems: int, dtype: torch.dtype, epoch: int) -> torch.Tensor:
        """Half ``epoch % 2`` of a two-half symmetric buffer of ``elems`` ``dtype`` each."""
        item = torch.empty((), dtype=dtype).element_size()
        half = max(-(-elems * item // _ALIGN) * _ALIGN, _ALIGN)
        buf = self.symmetric(name, 2 * half)
        lo = (epoch % 2) * half
        return buf[lo:lo + elems * item].view(dtype)

    def pad(self, name: str, slots: int) -> torch.Tensor:
        return self.symmetric(name, 8 * slots).view(torch.int64)

    def tiles(self, dtype) -> tuple[int, int, int]:
        if self.interpret:
            return self.k.INTERP_BLOCKS
        return self.k.GPU_BLOCKS[{torch.float32: "fp32", torch.bfloat16: "bf16",
                                  torch.float16: "fp16"}[dtype]]

    def precision(self, dtype) -> str:
        return "ieee" if dtype == torch.float32 else "tf32"


def _engine(comm, device: torch.device) -> _Engine:
    per = _ENGINES.setdefault(comm, {})
    eng = per.get(device.type)
    if eng is None:
        eng = per[device.type] = _Engine(comm, device)
    return eng


def all_gather_matmul(comm, a, b, out=None, return_gathered=False, copy="kernel"):
    """See :func:`tilecomm.ops.all_gather_matmul` (kernel engine). ``copy="kernel"``: one
    persistent kernel that gets the peers' row blocks itself; ``"stream"``: see
    :func:`_gather_by_stream`."""
    w, me = comm.world_size, comm.rank
    shape = (lambda x, y: (w * x.shape[0], y.shape[1]))
    checks.agree(comm, checks.OPS[0], "kernel", a, b, out=out, out_shape=shape,
                 device_ok=_device_ok, flag=return_gathered, copy=copy)
    eng = _engine(comm, a.device)
    m, k = a.shape
    n = b.shape[1]
    bm, bn, bk = eng.tiles(a.dtype)
    epoch = eng.next_epoch("ag")
    g = eng.halves("ag.g", w * m * k, a.dtype, epoch).view(w * m, k)
    pad = eng.pad("ag.pad", w + w * -(-m // bm))
    g[me * m:(me + 1) * m].copy_(a)
    dst = out if out is not None and out.is_contiguous() else \
        torch.empty((w * m, n), dtype=a.dtype, device=a.device)
    tasks = w * -(-m // bm) * -(-n // bn)
    h = eng.heap
    if copy == "stream":
        _gather_by_stream(eng, g, b, dst, pad, epoch, w, me, m, n, k, (bm, bn, bk))
    else:
        eng.k.all_gather_matmul_kernel[(max(1, min(eng.programs, tasks)),)](
            g, b, dst, pad, h.handle, epoch, m, n, k, b.stride(0), b.stride(1), WORLD=w, BM=bm,
            BN=bn, BK=bk, PRECISION=eng.precision(a.dtype))
    h.check(f"all_gather_matmul (epoch {epoch})")
    if out is not None and dst is not out:
        out.copy_(dst)
    dst = out if out is not None else dst
    return (dst, g.clone()) if return_gathered else dst


def _gather_by_stream(eng, g, b, dst, pad, epoch, w, me, m, n, k, blocks) -> None:
    """all_gather_matmul with the copy engine (``copy="stream"``); ``g[me]`` already holds
    this rank's chunk (queued on the current stream).

    Current stream: the ready signal to every peer (the same pad slots and epochs as the
    persistent kernel, so calls of both variants can follow each other), the own chunk's
    GEMM, then per peer chunk (rotation order ``me+1, me+2, ...``) a wait for its copy's
    event and its GEMM. Side stream (after everything queued so far on the current one, so the
    previous calls' GEMMs have read the half of ``g`` about to be overwritten): per peer chunk,
    a one-program kernel that waits for the owner's ready signal (bounded, acquire), the copy
    of the chunk from the owner's ``g`` (``heap.peer_view``: cudaMemcpyAsync, the copy engine),
    an event. Reuse of the halves of ``g``: as the persistent kernel (overlap_gemm's
    docstring): the ready signal of call ``k+1`` is queued behind every GEMM of call ``k``,
    and those waited for all of call ``k``'s copies. On CPU tensors (interpreter) the same
    steps run one after the other and the copies are CPU memcpys: a functional test of the
    protocol, not of the overlap.
    """
    h, kk = eng.heap, eng.k
    bm, bn, bk = blocks
    prec = eng.precision(g.dtype)
    g_peer = {}

    def gemm(src):
        grid = (max(1, -(-m // bm) * -(-n // bn)),)
        kk.chunk_matmul_kernel[grid](g, b, dst, src * m, m, n, k, b.stride(0), b.stride(1),
                                     BM=bm, BN=bn, BK=bk, PRECISION=prec)

    def fetch(src):
        kk.wait_chunk_kernel[(1,)](pad, src, epoch, h.handle)
        if src not in g_peer:
            g_peer[src] = h.peer_view(g, src)
        if m:
            g[src * m:(src + 1) * m].copy_(g_peer[src][src * m:(src + 1) * m])

    kk.chunk_ready_kernel[(1,)](pad, h.handle, epoch, WORLD=w)
    if m == 0:                      # nothing to read (the persistent kernel only signals too)
        return
    gemm(me)
    peers = [(me + j) % w for j in range(1, w)]
    if g.device.type != "cuda":
        for src in peers:
            fetch(src)
            gemm(src)
        return
    main = torch.cuda.current_stream(g.device)
    side = eng.side_stream()
    side.wait_stream(main)
    events = []
    with torch.cuda.stream(side):
        for src in peers:
            fetch(src)
            ev = torch.cuda.Event()
            ev.record(side)
            events.append(ev)
    for src, ev in zip(peers, events):
        main.wait_event(ev)
        gemm(src)
    # the peer views are not owned by torch's allocator: nothing to record_stream for; g is
    # the engine's buffer (freed only after a device barrier, _Engine.symmetric)


def matmul_reduce_scatter(comm, a, b, out=None):
    """See :func:`tilecomm.ops.matmul_reduce_scatter` (kernel engine)."""
    w = comm.world_size
    shape = (lambda x, y: (x.shape[0] // w, y.shape[1]) if x.shape[0] % w == 0 else None)
    checks.agree(comm, checks.OPS[1], "kernel", a, b, out=out, out_shape=shape,
                 device_ok=_device_ok)
    eng = _engine(comm, a.device)
    m, n, k = a.shape[0] // w, b.shape[1], a.shape[1]
    bm, bn, bk = eng.tiles(a.dtype)
    epoch = eng.next_epoch("rs")
    part = eng.halves("rs.part", w * m * n, a.dtype, epoch)      # partials: a's dtype
    tiles = -(-m // bm) * -(-n // bn)
    pad = eng.pad("rs.pad", w * tiles)
    dst = out if out is not None and out.is_contiguous() else \
        torch.empty((m, n), dtype=a.dtype, device=a.device)
    h = eng.heap
    eng.k.matmul_reduce_scatter_kernel[(max(1, min(eng.programs, tiles)),)](
        a, b, part, dst, pad, h.handle, epoch, m, n, k, a.stride(0), a.stride(1), b.stride(0),
        b.stride(1), WORLD=w, BM=bm, BN=bn, BK=bk, PRECISION=eng.precision(a.dtype))
    h.check(f"matmul_reduce_scatter (epoch {epoch})")
    if out is not None and dst is not out:
        out.copy_(dst)
        return out
    return dst

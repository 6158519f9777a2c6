"""Triton backend: collectives on device tensors as fused Triton kernels over a symmetric heap.

``TritonBackend(comm, device)`` runs a :class:`~tilecomm.backends.base.CollectiveCall` whose
buffers are flat torch tensors on ``device`` by looking its ``(collective, algo)`` up in
:data:`registry.KERNELS` and calling the launcher (contract: :mod:`.registry`).

Per call, on every rank (NOTE [asynchronous calls] below):

1. the zero-copy decision: the source is read in place when it is a heap tensor (every rank
   must then pass one at the same offset, or none), and the call's digest (collective, algo,
   dtype, count, op, root, input offset) is folded into a rolling digest;
2. a new epoch: ``ctx.epoch_dev += 1`` on the stream, which the kernels load (NOTE [device
   epochs] in context.py), and the host count (``DeviceHeap.next_epoch``, for naming), then
   the launcher (kernels on the current stream, cooperative on CUDA); the call returns
   without waiting for them;
3. every ``TILECOMM_DEVICE_CHECK_EVERY`` calls, a check point: the ranks compare their
   rolling digests (one host handshake; a mismatch raises ``CommMismatch``) and the error
   word is polled without blocking; :meth:`TritonBackend.synchronize` (``comm.synchronize()``,
   also at close) waits and reads it. A device wait that gave up raises ``CommTimeout``
   (``DeviceTimeout``) naming the call that failed (collective/algo, rank, peer, epoch).

``TILECOMM_DEVICE_DEBUG=1`` (``backend.debug``) makes every call synchronous as before: a host
handshake that compares the call's digest and the input placements before launching
(``CommMismatch`` on every rank; a rank that rejected its call makes the others raise), and
``DeviceHeap.check`` after it.

``device="cpu"`` runs the same kernels in the Triton interpreter on the shared-memory heap
(``TILECOMM_CPU_KERNELS=triton``; the tests use it). Importing this module does not import
triton; the kernel families are imported on the first call.
"""

from __future__ import annotations

import sys
import zlib
from collections import deque

import numpy as np
import torch

from ...device import errors as _errors
from ...errors import CommError, CommMismatch
from ..base import Backend, CollectiveCall
from . import registry
from .context import KernelContext

#: calls whose epochs are kept to name the call a device error belongs to
RING_CALLS = 4096

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
    """NOTE [co-residency] (NOTE [CTA budget] in tilecomm.device.budget): on CUDA every
    collective kernel is launched
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
        #: the communicator's host port: handshakes and agreement on the host executor, never
        #: dispatched back to a kernel backend (tilecomm.host)
        self.host = comm.host
        device = torch.device(device)
        if device.type == "cuda" and device.index is None and torch.cuda.is_available():
            device = torch.device("cuda", torch.cuda.current_device())
        if interpreted():
            # NOTE [interpreter bf16 rounding]: round float32 -> bf16 as a GPU does
            from ...device.interpreter import round_bf16_like_gpu
            round_bf16_like_gpu()
        self.heap = DeviceHeap.create(comm, device=device,
                                      nbytes=nbytes or settings().device_heap_bytes,
                                      timeout=timeout)
        self.device = self.heap.device
        self.ctx = KernelContext(self.heap, self.host, interpret=interpreted())
        #: kernels launched cooperatively (CUDA; NOTE [co-residency])
        self.cooperative: list[str] = []
        if self.device.type == "cuda" and not interpreted() and settings().gpu_cooperative \
                and cooperative_supported():
            registry.load()
            self.cooperative = cooperative_launches()
            self.ctx.launch_options = {"launch_cooperative_grid": True}
        s = settings()
        #: NOTE [asynchronous calls]: False (default): no host handshake and no error read per
        #: call; True (TILECOMM_DEVICE_DEBUG=1): both after every call. Per backend, may be
        #: changed between calls (on every rank alike).
        self.debug = bool(s.device_debug)
        #: calls between two check points in the asynchronous mode (TILECOMM_DEVICE_CHECK_EVERY)
        self.check_every = max(1, int(s.device_check_every))
        self.calls = 0                    # GPU collectives run by this backend
        #: (first epoch, last epoch, collective, algo, call number) of the recent calls, to
        #: name the call a device error record (which holds an epoch) belongs to
        self._ring: deque = deque(maxlen=RING_CALLS)
        self._specs: dict = {}            # (collective, algo, dtype, op, fused) -> KernelSpec
        self._digests: dict = {}          # call signature -> crc32
        self._digest = 0                  # rolling digest of the calls since the last compare
        self._digest_from = 1             # first call number the rolling digest covers
        self._force_check = False         # a call was rejected here: compare before the next
        #: (collective, algo, call number) of the calls captured into CUDA graphs (NOTE
        #: [CUDA graphs]): they have no host epochs, their replays take device epochs
        self.captured: deque = deque(maxlen=64)
        #: the communicator's flight recorder: a GPU call's record notes its call number,
        #: which a device error record names (tilecomm.debug.flight)
        self._flight = getattr(comm, "flight", None)
        #: NVTX ranges around the launches on CUDA while tracing (TILECOMM_TRACE), so Nsight
        #: Systems shows which collective launched which kernels
        self._nvtx = (self.device.type == "cuda" and self._flight is not None
                      and self._flight.tracer is not None)

    # ---- what the Communicator asks before a call ------------------------------------------
    def algorithms(self, collective: str) -> list[str]:
        return registry.supported(collective)

    def check(self, collective: str, algo: str, dtype: torch.dtype, op) -> None:
        spec = registry.lookup(collective, algo, dtype, None if op is None else op.value)
        if getattr(spec.launch, "__name__", "") == "launch_plan":
            from .kernels.plan import MAX_WORLD
            if self.world_size > MAX_WORLD:
                raise ValueError(
                    f"{collective}/{algo}: the plan kernel keeps its waits as 64-bit rank "
                    f"masks, so it serves at most {MAX_WORLD} ranks ({self.world_size} here); "
                    f"use an algorithm with a fused GPU kernel")

    def alloc(self, shape, dtype=torch.float32) -> torch.Tensor:
        """A zero-filled symmetric tensor on this backend's device (collective)."""
        shape = (shape,) if isinstance(shape, int) else tuple(shape)
        n = int(np.prod(shape, dtype=np.int64))
        return self.heap.alloc(n, dtype).reshape(shape)

    # ---- a call -----------------------------------------------------------------------------
    # NOTE [asynchronous calls]: by default a call only launches its kernels: no host
    # handshake, no synchronization, no host allocation once scratch has grown, nothing a
    # CUDA graph capture forbids. What the per-call handshake did is done otherwise:
    #
    # * zero copy: a source that is a heap tensor is read in place. Every rank must then pass
    #   a heap tensor at the same offset (what comm.alloc gives when every rank allocates the
    #   same way) or every rank a tensor outside the heap: a rank cannot see its peers'
    #   choice without a handshake. Checked in debug mode (CommMismatch naming each rank's
    #   placement) and by the rolling digest below.
    # * mismatched calls (collective, algorithm, dtype, count, op, root, input placement): a
    #   digest of every call is folded into a rolling digest that the ranks compare, with one
    #   host handshake, every ``check_every`` calls: a mismatch raises CommMismatch on every
    #   rank naming the range of calls; TILECOMM_DEVICE_DEBUG=1 compares each call before it
    #   launches (as before) to find it. Until the check point a mismatched call gives wrong
    #   results or a device timeout, as with NCCL.
    # * device timeouts: the error word is read without blocking every ``check_every`` calls
    #   (an asynchronous copy examined at the next check point), and with a synchronization
    #   at :meth:`synchronize` (comm.synchronize()) and at close. A record names the call that
    #   failed by its epoch (``_ring``). After a failure the later waits of this rank give up
    #   at once until the record is read, so a dead peer costs one timeout.
    #
    # NOTE [CUDA graphs]: such a call can be captured (after a warm-up call of the same sizes:
    # pads and scratch grow collectively, with host barriers). The captured kernels load their
    # epoch from ``ctx.epoch_dev`` and pick their scratch halves from it, and the captured
    # ``epoch_dev += 1`` runs again at every replay (NOTE [device epochs] in context.py), so
    # replays synchronize like eager calls. A captured call advances no host epoch and goes to
    # ``captured``, not ``_ring``; after replays the device epoch is ahead of the host count,
    # which ``synchronize`` (and a raised device error) brings up to it, and a device error
    # with an epoch the host did not count is named as a graph replay.
    def run(self, call: CollectiveCall) -> None:
        if self._force_check and not self.debug:
            self._force_check = False
            self._check_point()
        opv = None if call.op is None else call.op.value
        # fused_enabled is part of the key: flipping registry.FUSED between calls must switch
        # kernels (a cache without it once let a conformance test compare fused with fused)
        skey = (call.collective, call.algo, call.dtype.torch, opv, registry.fused_enabled())
        spec = self._specs.get(skey)
        if spec is None:
            spec = self._specs[skey] = registry.lookup(call.collective, call.algo,
                                                       call.dtype.torch, opv)
        src = call.buffers.get(SOURCE.get(call.collective, "in"))
        off = self.ctx.heap_offset(src) if src is not None else -1
        if self.debug:
            self._handshake(call, opv, off)
        else:
            dkey = (skey, call.count, call.root, call.send_rows is not None, off, call.row_shape)
            d = self._digests.get(dkey)
            if d is None:
                if len(self._digests) >= 1024:
                    self._digests.clear()
                d = self._digests[dkey] = zlib.crc32(
                    (self._describe(call, opv) + f"|{off}").encode())
            self._digest = (self._digest * 1000003 + d) & 0x3FFFFFFF
        if call.count == 0 and call.send_rows is None:
            # Empty: nothing is launched on any rank (a rank that disagrees on the count is
            # caught by the digest like any mismatch). It must not consume an epoch: a call
            # that takes an epoch but launches nothing would let a rank reuse a parity half
            # that a lagging peer still reads (rule 2 holds only between calls that launch).
            self.calls += 1
            self._after_call(None)
            return
        ctx = self.ctx
        ctx.begin(off >= 0)
        first = ctx.epoch
        self.calls += 1
        fl = self._flight
        if fl is not None and fl.enabled and fl.records:
            fl.records[-1].device = {"device_call": self.calls}   # this call's record
        if self._nvtx:
            torch.cuda.nvtx.range_push(f"tilecomm {call.collective}/{call.algo}")
        try:
            spec.launch(ctx, call)
        finally:
            if self._nvtx:
                torch.cuda.nvtx.range_pop()
            if ctx.capturing():     # NOTE [CUDA graphs]: its epochs are the replays'
                self.captured.append((call.collective, call.algo, self.calls))
            else:
                self._ring.append((first, ctx.epoch, call.collective, call.algo, self.calls))
        self._after_call(f"{call.collective}/{call.algo}")

    def _after_call(self, launched: str | None) -> None:
        """Debug mode: read the error word of the kernels just launched (``launched`` names
        them; None: nothing was launched) and restart the digest, which the handshake checked.
        Asynchronous mode: a check point every ``check_every`` calls."""
        if self.debug:
            if launched is not None:
                self.heap.check(launched)
            self._digest, self._digest_from = 0, self.calls + 1
        elif self.calls % self.check_every == 0:
            self._check_point()

    @staticmethod
    def _describe(call: CollectiveCall, opv) -> str:
        return (f"{call.collective}|{call.algo}|{call.dtype.name}|{call.count}|{opv or ''}|"
                # all_to_all_v: send_rows legitimately differ between ranks (not compared)
                f"{call.root}|{'v' if call.send_rows is not None else ''}|{call.row_shape}")

    def _handshake(self, call: CollectiveCall, opv, off: int) -> None:
        """Debug mode: compare this call with the peers' before launching (host handshake)."""
        desc = self._describe(call, opv)
        digest = zlib.crc32(desc.encode()) & 0x3FFFFFFF
        try:
            offs = self.host.rendezvous(call.collective, digest, off)
        except CommMismatch as e:
            raise CommMismatch(f"{e} (the digest of the call; this rank called {desc})") from None
        if len(set(offs)) > 1:
            where = ", ".join(f"rank {r}: " + (f"heap offset {o}" if o >= 0 else
                                                "outside the symmetric heap")
                              for r, o in enumerate(offs))
            raise CommMismatch(
                f"{call.collective}/{call.algo}: ranks pass the input from different places "
                f"({where}). A heap tensor (comm.alloc) is read in place without asking the "
                f"peers, so every rank must pass heap tensors at the same offset, or none "
                f"(TILECOMM_DEVICE_DEBUG checks this per call)")

    def _check_point(self) -> None:
        """Every ``check_every`` calls (asynchronous mode): compare the rolling digest of the
        calls since the last check point (one host handshake, no device synchronization) and
        look at the error word without blocking. Skipped while a CUDA graph is captured."""
        if self.device.type == "cuda" and torch.cuda.is_current_stream_capturing():
            return
        first, last = self._digest_from, self.calls
        digest, self._digest, self._digest_from = self._digest, 0, last + 1
        try:
            self.host.rendezvous("barrier", digest, 0)
        except CommMismatch as e:
            raise CommMismatch(
                f"GPU collectives #{first}..#{last} differ between ranks: their digests "
                f"(collective, algorithm, dtype, count, op, root, heap offset of the input; "
                f"compared every {self.check_every} calls) disagree ({e}). Rerun with "
                f"TILECOMM_DEVICE_DEBUG=1 to find the call") from None
        words = self.heap.poll_error_words()
        if words is not None and words[_errors.CODE] != 0:
            self._raise_device_error(f"at the check point after call #{last}")

    def synchronize(self) -> None:
        """Wait for this rank's queued kernels and raise the device error they recorded, if
        any (``DeviceTimeout``, a ``CommTimeout``, naming the call that failed). Local.
        Brings the host epoch count up to the device's after CUDA graph replays."""
        words = self.heap.error_words()
        if words[_errors.CODE] != 0:
            self._raise_device_error("at comm.synchronize()", words)
        self.ctx.resync()

    def _raise_device_error(self, where: str, words=None) -> None:
        if words is None:
            words = self.heap.error_words()      # all the waits that gave up, counted
        epoch = words[_errors.EPOCH]
        host, dev = self.ctx.epoch, self.ctx.device_epoch()     # synchronized already
        name, seq = f"GPU collective of epoch {epoch} (older than the last {len(self._ring)} " \
                    f"calls)", -1
        # host epochs name calls exactly up to the first capture since the last resync
        exact = host if self.ctx.exact_upto is None else self.ctx.exact_upto
        if epoch <= exact:
            for first, last, coll, algo, n in reversed(self._ring):
                if first <= epoch <= last:
                    name, seq = f"{coll}/{algo}", n
                    break
        else:
            # NOTE [CUDA graphs]: epochs the host did not count come from graph replays
            what = ", ".join(dict.fromkeys(f"{c}/{a}" for c, a, _ in self.captured))
            name = (f"GPU collective of epoch {epoch}, launched by a CUDA graph replay (or "
                    f"after one; device epoch {dev}, host count {host}"
                    f"{'; captured: ' + what if what else ''})")
        err = _errors.decode(words, name, timeout=self.heap.timeout)
        self.heap.clear_errors()
        self.ctx.resync()
        if err is None:
            return
        mode = ("TILECOMM_DEVICE_DEBUG=1 checks after every call" if not self.debug else
                "debug mode")
        msg = (f"{err} [GPU call #{seq} of this rank; found {where}: the device error word "
               f"is read every {self.check_every} calls, at comm.synchronize() and at close "
               f"({mode}); the calls since did not complete correctly and the ranks' epochs "
               f"are out of step: create a new communicator]")
        err.args = (msg,)
        err.seq = seq
        raise err

    def forget_calls(self) -> None:
        """Drop what this backend keeps per call (kernel lookups, call digests, encoded plans;
        not the encodings a captured CUDA graph may still read). Local."""
        self._specs.clear()
        self._digests.clear()
        if not self.ctx.graph_captured:
            self.ctx.encodings.clear()

    def realign(self) -> None:
        """After a device error a harness chose to survive (collective): wait for this rank's
        kernels, drop the error record and what the rolling digest holds, and take a common
        epoch above every one used (``KernelContext.realign``)."""
        self.ctx.realign(self.ctx.host_all_gather)
        self.heap.clear_errors()
        self._digest, self._digest_from, self._force_check = 0, self.calls + 1, False
        self.host.barrier()

    # ---- the rest goes to the host backend ---------------------------------------------------
    def reject(self, collective: str, message: str) -> None:
        """A call this rank refused before launching (bad argument). Debug mode: announced on
        the host, so every rank raises at this call. Asynchronous mode: the peers are not on
        the host (they may have launched the call), so waiting there would hang; the refusal
        is folded into the rolling digest and this rank's next call (or close) starts with a
        check point, which raises CommMismatch on every rank unless all refused alike. The
        caller raises the original error at once. Until then a peer that launched the call
        waits on the device for this rank and records a timeout naming it; this rank launches
        nothing before the check point, so no later call pairs with the refused one."""
        if self.debug:
            self.host.reject(collective, message)
            return
        marker = zlib.crc32(f"rejected|{collective}".encode())
        self._digest = (self._digest * 1000003 + marker) & 0x3FFFFFFF
        self._force_check = True

    def rendezvous(self, name: str, count: int, extra: int) -> list[int]:
        return self.host.rendezvous(name, count, extra)

    def send(self, data, dtype, numel, peer):
        raise CommError("send on device tensors is not implemented; copy to the CPU")

    def recv(self, out, dtype, numel, peer):
        raise CommError("recv on device tensors is not implemented; copy to the CPU")

    def probe(self, peer: int) -> bool:
        return self.host.probe(peer)

    def close(self) -> None:
        """Compare the calls since the last check point (collective: every rank closes), then
        release the device heap. ``Communicator.close`` calls :meth:`synchronize` first."""
        try:
            if not self.debug and (self._force_check or self._digest_from <= self.calls):
                self._force_check = False
                try:
                    self._check_point()
                except CommMismatch:
                    raise
                except CommError:
                    pass    # unusable already, or a peer is gone: nothing left to compare
        finally:
            self.heap.close()


__all__ = ["TritonBackend", "KernelContext", "registry"]

"""Communicator: the user-facing object. Validates every call, picks the algorithm, dispatches.

Every collective must be called by all ranks in the same order with matching arguments. A call
a rank rejects (bad argument) is announced to the peers, so every rank raises instead of waiting;
ranks that disagree (collective, count, dtype, op, root, algorithm) all raise
:class:`~tilecomm.CommMismatch`; a peer that never arrives makes the waiters raise
:class:`~tilecomm.CommTimeout` after ``timeout`` seconds.
"""

from __future__ import annotations

import contextlib
import gc
import weakref
from typing import Sequence

import numpy as np
import torch

from . import tuner, tuning
from .algorithms.lower import deterministic_algorithms
from .algorithms.registry import algorithms
from .backends.base import DEVICE_BACKENDS, Backend, CollectiveCall, PreparedCall
from .buffers import Bytes, as_tensor, buffer_for, host_tensor
from .calls import CallMemo, memo_key
from . import elastic
from .debug import attach as _attach_debug
from .errors import CommError, NoDeviceError
from .heap.allocator import HeapAllocator
from .hier.layout import Topology
from .host import HostPort
from .types import DType, ReduceOp, flat_view, lookup_dtype


#: collectives whose result depends on the reduction order
_REDUCING = ("all_reduce", "reduce_scatter", "reduce")


class Communicator:
    """A group of ``world_size`` ranks that exchange CPU tensors through a symmetric heap.

    Create one with :func:`tilecomm.launch` (local processes) or :func:`tilecomm.init`
    (under torchrun); do not construct it directly.
    """

    def __init__(self, backend: Backend, heap, *, timeout: float,
                 deterministic: bool | None = None, heap_rank: int | None = None,
                 backends: dict[str, Backend] | None = None, layout=None):
        from .hier.layout import HostLayout
        from .settings import settings

        self.rank = backend.rank
        #: rank-order bits for every all_reduce / reduce_scatter / reduce (see
        #: TILECOMM_DETERMINISTIC); every rank must set the same value (a disagreement shows
        #: up as a CommMismatch on the algorithm)
        self._deterministic = settings().deterministic if deterministic is None \
            else bool(deterministic)
        self.world_size = backend.world_size
        self.timeout = timeout
        self._backend = backend             # host backend: handshakes, send/recv, CPU tensors
        # device type -> backend of its collectives (created on first use unless given)
        self._backends: dict[str, Backend] = dict(backends or {})
        self._heap = heap
        #: which ranks share a host (one host unless ranks span hosts; see ``topology``)
        self.layout = layout or HostLayout((tuple(range(self.world_size)),))
        # this rank's index in the heap it maps (the host's ranks only)
        self._heap_rank = self.rank if heap_rank is None else heap_rank
        lay = heap.layout
        self._alloc = HeapAllocator(lay.heap_offset, lay.heap_bytes)
        self._closed = False
        #: the validated calls kept for reuse (tilecomm.calls: NOTE [call memo], [pair memo])
        self._calls = CallMemo()
        self._exchange_bufs: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
        seg = heap.segment(self._heap_rank)
        self._heap_lo = seg.ctypes.data + lay.heap_offset
        self._heap_hi = seg.ctypes.data + lay.heap_offset + lay.heap_bytes
        #: the control path of the layers built on this communicator (tilecomm.host)
        self.host = HostPort(self, backend, heap, self._heap_rank,
                             (self._heap_lo, self._heap_hi), self._validating)
        #: the flight recorder of this communicator's calls (tilecomm.debug.flight)
        self.flight = _attach_debug(self, backend)
        #: how the ranks met, for shrink and grow (tilecomm.elastic.Membership)
        self.membership = elastic.Membership()
        #: the shared-memory heaps of the communicators this one replaced (shrink, grow): a
        #: tensor in one of them, while it is still mapped, is refused, not staged
        self.retired_heaps: list = []
        #: what algo="auto" predicts costs with (tilecomm.tuning; NOTE [auto by predicted cost]):
        #: this machine's tune file or the shipped defaults, the same on every rank once
        #: :meth:`settle_costs` has compared them
        self.costs = tuning.current()
        #: the last algo="auto" decision of this rank (a tuning.Choice: what ran and the
        #: predicted times of the top candidates); repeated calls reuse it
        self.last_auto = None

    def costs_word(self) -> int:
        """A word of this rank's cost model digest, for the creation handshake."""
        return int(self.costs.digest()[:15], 16)

    def settle_costs(self, words) -> None:
        """After the creation handshake: ``words`` are the ranks' :meth:`costs_word`. Ranks
        whose tune files differ (hosts tuned apart) would resolve ``auto`` differently, so
        then every rank that sees it uses the shipped defaults (the same everywhere)."""
        if len(set(words)) > 1:
            self.costs = tuning.store.defaults().with_source(
                "shipped defaults: the ranks' tune files differ")

    @property
    def deterministic(self) -> bool:
        """True: every all_reduce, reduce_scatter and reduce returns the bits of the rank-order
        reference (float32 accumulation in rank order 0..W-1, one rounding), at any size;
        ``algo="auto"`` picks only algorithms that guarantee it and others are refused.
        Set it to the same value on every rank."""
        return self._deterministic

    @deterministic.setter
    def deterministic(self, value: bool) -> None:
        self._deterministic = bool(value)
        self.forget_calls()          # memoized calls hold algorithms resolved in the old mode

    def forget_calls(self) -> None:
        """Forget every validated call kept for reuse (the call memos, NOTE [call memo] and
        NOTE [pair memo]) and what the backends built for them (ready-made steps, native
        programs). The one place that does so: when the mode changes (deterministic), when
        the engine of CPU tensors changes (:meth:`use_cpu_kernels`), at close. Local."""
        self._calls.forget()
        for be in self._each_backend():
            forget = getattr(be, "forget_calls", None)
            if forget is not None:
                forget()

    def _each_backend(self) -> list[Backend]:
        """The host backend and every device backend, each once (``"cpu"`` may map to the
        host backend itself)."""
        return list({id(b): b for b in [self._backend, *self._backends.values()]}.values())

    # ---- lifecycle ------------------------------------------------------------------------
    def close(self) -> None:
        """Release this rank's mappings. Tensors from :meth:`alloc` must not be used after."""
        if not self._closed:
            pending = None
            try:
                self.synchronize()      # the device error word, read lazily (GPU kernels)
            except CommError as e:
                pending = e             # raised once everything is released
            self.forget_calls()
            self._closed = True
            for be in self._backends.values():
                if be is not self._backend:
                    be.close()
            self._backends.clear()
            self._backend.close()
            # the rendezvous stores: a TCP store's C++ side must not outlive the communicator
            # in a garbage cycle that a process forked later would collect without its threads
            self.membership.keep.clear()
            self.membership.store = None
            if pending is not None:
                raise pending

    # ---- failures: abort, revoke, shrink, grow (tilecomm.elastic) ------------------------
    def abort(self, reason: str = "") -> None:
        """Stop this communicator on every rank, from any thread (a watchdog, a signal
        handler): every call in flight on any rank ends within about 0.2 s, and every later
        one at once, with :class:`~tilecomm.CommAborted` naming this rank and ``reason``. The
        communicator then takes no calls but :meth:`shrink` (the survivors' new
        communicator) and :meth:`close` (which releases its memory). Local: the other ranks
        learn it from this rank's stop word. Idempotent; the first stop's reason stays."""
        self._stop("abort", reason)

    def revoke(self, reason: str = "") -> None:
        """Like :meth:`abort`, but what the calls raise is :class:`~tilecomm.CommRevoked`
        (a CommAborted) saying the communicator was revoked, for the ranks that will shrink
        it: in-flight calls end, and it then takes only :meth:`shrink` and :meth:`close`."""
        self._stop("revoke", reason)

    def _stop(self, how: str, reason: str) -> None:
        why = str(reason) if reason else f"comm.{how}() was called"
        self.flight.event(how, f"rank {self.rank}: {why}")
        if not self._closed:
            self.host.stop(revoke=how == "revoke", reason=why)

    def shrink(self, exclude: Sequence[int], *, abort: bool = False,
               timeout: float | None = None) -> "Communicator":
        """A new communicator over the ranks not in ``exclude``, renumbered 0..n-1 in their
        old order. Called by those ranks only (the survivors), with the same ``exclude`` on
        each (``CommMismatch`` naming each rank's list otherwise); the excluded ranks may be
        dead, stopped or alive. ``abort=True`` first aborts this communicator (:meth:`abort`),
        ending what is in flight on every rank. Works on a communicator that failed, was
        aborted or was revoked. The new one has its own symmetric heap: tensors from this
        one's :meth:`alloc` are refused there. This communicator stays open: close it
        (``timeout``: bounds each wait of the shrink; default this communicator's)."""
        excluded = elastic.exclude_list(self, exclude)
        if abort:
            self.abort(f"shrink(exclude={excluded}, abort=True)")
        rec = self.flight.issue("shrink", None, 0, None, ordered=False)
        try:
            new = elastic.shrink(self, excluded, self.timeout if timeout is None
                                 else float(timeout))
        except BaseException as e:
            self.flight.fail(rec, e)
            raise
        self.flight.done(rec, note=f"excluded {excluded}; {new.world_size} ranks, this one "
                                   f"now rank {new.rank}")
        new.retire(self)
        return new

    def grow(self, n: int, *, timeout: float | None = None) -> elastic.Growth:
        """Start adding ``n`` new ranks (collective over this communicator's ranks). Returns a
        :class:`~tilecomm.elastic.Growth`: give its ``ticket`` (a string) to the new processes,
        which call ``tilecomm.join(ticket, i)`` for i in 0..n-1, and call its ``join()`` here;
        both return the grown communicator (these ranks keep their numbers, the new ones are
        ``world_size + i``). Every wait is bounded by ``timeout`` (default this
        communicator's); a rank that never joins is named."""
        self._check_open()
        from .launch import rendezvous_host
        tmo = self.timeout if timeout is None else float(timeout)
        rec = self.flight.issue("grow", None, 0, None, ordered=False)
        try:
            g = elastic.grow(self, n, tmo, rendezvous_host())
        except BaseException as e:
            self.flight.fail(rec, e)
            raise
        self.flight.done(rec, note=f"by {n} ranks: {g.ticket}")
        return g

    def synchronize(self) -> None:
        """Wait for the collectives this rank queued on a device (GPU kernels run
        asynchronously) and raise what the device recorded since the last check: a device
        wait that gave up raises ``CommTimeout`` naming the call (collective/algorithm, rank,
        peer, epoch). Local: the other ranks do not take part."""
        self._check_open()
        for be in self._each_backend():
            sync = getattr(be, "synchronize", None)
            if sync is not None:
                try:
                    sync()
                except BaseException as e:
                    self.flight.fail(self.flight.issue("synchronize", None, None, None,
                                                       ordered=False), e)
                    raise

    def recover_device(self) -> None:
        """After a device error that a test or check harness chooses to survive (a GPU
        collective that raised CommTimeout, wrong results it detected): every rank waits for
        its queued kernels, clears its device error record, and all ranks continue from a
        common epoch above every one used so far. Collective: every rank calls it at the same
        point. A job should make a new communicator instead (the failed calls' results are
        undefined)."""
        self._check_open()
        for be in self._each_backend():
            realign = getattr(be, "realign", None)
            if realign is not None:
                realign()
        self.barrier()

    def dump_flight(self, path: str | None = None) -> str:
        """Write this process's flight records (every communicator's) as JSON to ``path``
        (default ``TILECOMM_DEBUG_DIR/flight-rank{R}.json``); returns the path. Local."""
        return self.flight.dump(path)

    @property
    def closed(self) -> bool:
        """True once :meth:`close` ran (every later call raises CommError)."""
        return self._closed

    def __enter__(self) -> "Communicator":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"Communicator(rank={self.rank}, world_size={self.world_size})"

    @property
    def topology(self) -> Topology:
        """Where this rank sits: ``host`` (index), ``local_rank``, ``local_size``, ``rails``
        (the inter-host rails it is on), ``num_hosts`` and the whole ``layout``."""
        return Topology(self.layout, self.rank)

    @property
    def host_comm(self) -> "Communicator":
        """The communicator over the ranks of this rank's host (``topology.host_ranks``, local
        ranks 0..``local_size``-1), over their shared heap: this communicator itself when all
        ranks share one host. For code that splits its own work by host (the hierarchical
        collectives do: ``hier/``)."""
        return self._backend.host_communicator() or self

    def process_group(self, name: str, timeout: float | None = None, device: str = "cpu"):
        """A torch.distributed group over all ranks, in rank order, for a layer above the
        communicator that sends its own messages between hosts (``tilecomm.kv``): its tags
        and connections are its own. ``device``: ``"cpu"`` (Gloo) or ``"cuda"`` (NCCL, as
        the inter-host rails of CUDA collectives). Collective; closed with the communicator.
        None when all ranks share a host (they talk through the symmetric heap instead).
        ``timeout``: the group's timeout in seconds (default: the communicator's)."""
        self._check_open()
        return self._backend.process_group(name, timeout, device)

    # ---- symmetric memory -----------------------------------------------------------------
    def heap_blocks(self) -> list[tuple[int, int]]:
        """This rank's live symmetric allocations (from :meth:`alloc`) as ``(offset in the
        heap, bytes)``, by offset. The same on every rank while allocations and frees are in
        step; a tensor one rank still holds (in a cycle, a cache) shows here before the next
        ``alloc`` diverges."""
        base = self._heap.layout.heap_offset
        return [(off - base, n) for off, n in self._alloc.blocks()]

    def alloc(self, shape: int | Sequence[int], dtype: torch.dtype = torch.float32,
              device: str | torch.device | None = None) -> torch.Tensor:
        """A zero-filled tensor in symmetric memory (collective: all ranks, same order/sizes).

        Collectives on it read it where it is (no staging copy); :meth:`peer` views a peer's copy.
        ``device="cuda"`` allocates from the device backend's symmetric heap (CUDA IPC), which
        the GPU kernels read without staging.
        """
        if device is not None and torch.device(device).type != "cpu":
            with self._validating("alloc"):
                be = self._backend_for_device(torch.device(device).type, "alloc")
            return be.alloc(shape, dtype)
        shape = (shape,) if isinstance(shape, int) else tuple(shape)
        with self._validating("alloc"):
            d = lookup_dtype(dtype, what="alloc")
            if any((not isinstance(s, int)) or s < 0 for s in shape):
                raise ValueError(f"alloc: shape must be non-negative ints, got {shape}")
            nbytes = int(np.prod(shape, dtype=np.int64)) * d.itemsize
            off = self._alloc.alloc(nbytes)
        # Zero before the rendezvous: after it, a fast peer may already write into our copy.
        raw = self._heap.block(self._heap_rank, off, nbytes)
        raw[:] = 0
        rec = self.flight.issue("alloc", None, nbytes, d.name)
        try:
            # offsets within the user heap: they agree on every host when the allocations do
            offsets = self._backend.rendezvous("alloc", nbytes,
                                               off - self._heap.layout.heap_offset)
        except BaseException as e:
            self._alloc.free(off)
            self.flight.fail(rec, e)
            raise
        self.flight.done(rec)
        if len(set(offsets)) > 1:
            self._alloc.free(off)
            raise CommError(f"alloc: symmetric heap diverged (offsets {offsets}); free symmetric "
                            f"tensors in the same order on every rank")
        weakref.finalize(raw.base, self._alloc.free, off)  # runs when the last view is gone
        return as_tensor(raw, d).reshape(shape)

    def peer(self, tensor: torch.Tensor, rank: int) -> torch.Tensor:
        """View of ``rank``'s copy of the symmetric ``tensor`` (same offset in its segment)."""
        self._check_rank(rank, "peer", "rank")
        if not isinstance(tensor, torch.Tensor) or not tensor.is_contiguous():
            raise ValueError("peer: pass a contiguous tensor from comm.alloc")
        raw = flat_view(tensor).view(torch.uint8).numpy()
        off = self._heap.offset_of(raw)
        if off is None or off < self._heap.layout.heap_offset:
            raise ValueError("peer: tensor is not in symmetric memory; allocate it with "
                             "comm.alloc")
        d = lookup_dtype(tensor.dtype, what="peer")
        if self.layout.host_of(rank) != self.layout.host_of(self.rank):
            raise ValueError(f"peer: rank {rank} is on another host "
                             f"({self.topology.describe(rank)}); only the ranks of this host "
                             f"share memory with it")
        praw = self._heap.segment(self.layout.local_rank(rank))[off:off + raw.nbytes]
        return as_tensor(praw, d).reshape(tensor.shape)

    # ---- collectives ----------------------------------------------------------------------
    def all_reduce(self, tensor: torch.Tensor, op="sum", *, algo: str = "auto") -> torch.Tensor:
        """Reduce ``tensor`` over all ranks, in place; returns ``tensor``."""
        return self._in_place("all_reduce", tensor, op, algo, 0)

    def all_gather(self, tensor: torch.Tensor, out: torch.Tensor | None = None, *,
                   algo: str = "auto") -> torch.Tensor:
        """Concatenate every rank's ``tensor`` along dim 0, in rank order.

        Returns ``out`` of shape ``(world_size * tensor.shape[0], *tensor.shape[1:])``.
        """
        p = self._calls.pair_call("all_gather", tensor, out, None, algo)
        if p is not None:               # NOTE [pair memo]: checked here, one frame less
            self._run_prepared(p)
            return out
        w = self.world_size
        return self._two_buffer(
            "all_gather", tensor, out, None, algo,
            lambda t: (w * t.shape[0], *t.shape[1:]) if t.dim() else (w,), gathered=True)

    def reduce_scatter(self, tensor: torch.Tensor, op="sum", out: torch.Tensor | None = None, *,
                       algo: str = "auto") -> torch.Tensor:
        """Reduce over ranks and keep this rank's ``tensor.shape[0] // world_size`` rows."""
        p = self._calls.pair_call("reduce_scatter", tensor, out, op, algo)
        if p is not None:
            self._run_prepared(p)
            return out
        w = self.world_size
        return self._two_buffer("reduce_scatter", tensor, out, op, algo,
                                lambda t: (t.shape[0] // w, *t.shape[1:]))

    def broadcast(self, tensor: torch.Tensor, root: int = 0, *, algo: str = "auto") -> torch.Tensor:
        """Copy ``root``'s ``tensor`` into every rank's ``tensor``; returns ``tensor``."""
        return self._in_place("broadcast", tensor, None, algo, root)

    def reduce(self, tensor: torch.Tensor, root: int = 0, op="sum", *,
               algo: str = "auto") -> torch.Tensor:
        """Reduce into ``root``'s ``tensor`` (other ranks' tensors are left unchanged)."""
        return self._in_place("reduce", tensor, op, algo, root)

    def _in_place(self, name: str, tensor: torch.Tensor, op, algo: str, root: int):
        """all_reduce, broadcast and reduce: one buffer, updated in place (NOTE [call memo])."""
        memo = self._calls
        last = memo.last[0]
        if last is not None and last[0]() is tensor:    # the same tensor: no key to build
            # (written out: every repeated call's path; a frame costs 50-80 ns of its ~2 us)
            _, (n, ptr, dt, numel, o, a, r), p = last
            if (n == name and o == op and a == algo and r == root and dt == tensor.dtype
                    and ptr == tensor.data_ptr() and numel == tensor.numel()
                    and tensor.is_contiguous()):
                self._run_prepared(p)
                return tensor
        key = memo_key(name, tensor, op, algo, root)          # None: not a plain CPU tensor
        nbytes = key[3] * tensor.element_size() if key is not None else 0
        p = memo.small_call(key, nbytes) if key is not None else None
        if p is not None:   # the same small call again: skip validation and view-making
            memo.remember(tensor, key, p)
            self._run_prepared(p)
            return tensor
        with self._validating(name, tensor):
            if name != "all_reduce":
                self._check_rank(root, name, "root")
            rop = None if op is None else ReduceOp.parse(op, name)
            d = self._dtype(tensor, name, rop)
            be = self._backend_for(tensor, name)
            resolved = self._algo(name, algo, tensor.numel() * d.itemsize, be, d, rop, root,
                                  (tensor,))
            buf = buffer_for(be, tensor, name, heap=self._heap_bytes)
        p = be.prepare(CollectiveCall(name, resolved, d, tensor.numel(), {"buf": buf.flat},
                                      op=rop, root=root, cache_key=key,
                                      info=self._auto_note(algo)))
        if key is not None:
            memo.keep(tensor, key, p, nbytes, staged=buf.tmp is not None)
        self._run_prepared(p)
        buf.finish()
        return tensor

    def _two_buffer(self, name: str, tensor: torch.Tensor, out, op, algo: str, out_shape,
                    gathered: bool = False) -> torch.Tensor:
        """all_gather, reduce_scatter, all_to_all: ``tensor`` in, ``out`` (given, or made with
        ``out_shape(tensor)``) out. ``gathered``: all_gather (no row check; the tuner sizes
        it by its output). Keeps the call as the pair memo (NOTE [pair memo]), which the
        public methods check first."""
        given = out
        with self._validating(name, tensor):
            rop = None if op is None else ReduceOp.parse(op, name)
            d = self._dtype(tensor, name, rop)
            be = self._backend_for(tensor, name)
            if not gathered:
                self._check_rows(tensor, name)
            out = self._out(out, out_shape(tensor), tensor, name)
            sized = out if gathered else tensor
            resolved = self._algo(name, algo, sized.numel() * d.itemsize, be, d, rop,
                                  tensors=(tensor, out))
            src = buffer_for(be, tensor, name, write=False, heap=self._heap_bytes)
            dst = buffer_for(be, out, name, read=False, heap=self._heap_bytes)
        rows = () if name == "reduce_scatter" else tuple(tensor.shape[1:])
        key = CallMemo.pair_key(name, tensor, given, op, algo,
                                staged=src.tmp is not None or dst.tmp is not None)
        p = be.prepare(CollectiveCall(name, resolved, d, tensor.numel(),
                                      {"in": src.flat, "out": dst.flat}, op=rop,
                                      row_shape=rows, cache_key=key,
                                      info=self._auto_note(algo)))
        if key is not None:
            self._calls.keep_pair(tensor, given, key, p)
        self._run_prepared(p)
        dst.finish()
        return out

    def all_to_all(self, tensor: torch.Tensor, out: torch.Tensor | None = None, *,
                   algo: str = "auto") -> torch.Tensor:
        """Block ``j`` of ``tensor`` (dim 0 cut in ``world_size``) goes to rank ``j``; ``out``
        holds, in rank order, the block each rank sent here."""
        p = self._calls.pair_call("all_to_all", tensor, out, None, algo)
        if p is not None:
            self._run_prepared(p)
            return out
        return self._two_buffer("all_to_all", tensor, out, None, algo, lambda t: tuple(t.shape))

    def all_to_all_v(self, tensor: torch.Tensor, send_counts: Sequence[int],
                     recv_counts: Sequence[int] | None = None, *,
                     out: torch.Tensor | None = None, algo: str = "auto") -> torch.Tensor:
        """Uneven all-to-all along dim 0: ``send_counts[j]`` rows go to rank ``j``.

        Returns the received rows, in rank order, shape ``(sum(recv_counts), *tensor.shape[1:])``.
        ``recv_counts`` is optional (learned from the peers); when given it is checked. ``out``
        (which needs ``recv_counts``) receives the rows instead of a new tensor.
        """
        holder: list[torch.Tensor] = []
        with self._validating("all_to_all_v", tensor):
            d = self._dtype(tensor, "all_to_all_v")
            be = self._backend_for(tensor, "all_to_all_v")
            if tensor.dim() == 0:
                raise ValueError("all_to_all_v: tensor needs at least one dimension")
            send = self._counts(send_counts, "send_counts")
            if sum(send) != tensor.shape[0]:
                raise ValueError(f"all_to_all_v: send_counts sum to {sum(send)} but tensor has "
                                 f"{tensor.shape[0]} rows")
            recv = None if recv_counts is None else self._counts(recv_counts, "recv_counts")
            algo = self._algo("all_to_all_v", algo, tensor.numel() * d.itemsize, be, d)
            rest = tuple(tensor.shape[1:])
            row = int(np.prod(rest, dtype=np.int64))

            def make_out(rows: int) -> np.ndarray:
                holder.append(torch.empty((rows, *rest), dtype=tensor.dtype,
                                          device=tensor.device))
                return buffer_for(be, holder[-1], "all_to_all_v", read=False).flat

            bufs = {"in": buffer_for(be, tensor, "all_to_all_v", write=False).flat}
            dst = None
            if out is not None:
                if recv is None:
                    raise ValueError("all_to_all_v: out= needs recv_counts")
                out = self._out(out, (sum(recv), *rest), tensor, "all_to_all_v")
                dst = buffer_for(be, out, "all_to_all_v", read=False)
                bufs["out"] = dst.flat
                holder.append(out)
            elif recv is not None:
                bufs["out"] = make_out(sum(recv))
        self._run(be, "all_to_all_v", algo, d, row, bufs, send_rows=send, recv_rows=recv,
                  make_out=make_out, row_shape=tuple(rest))
        if dst is not None:
            dst.finish()
        return holder[-1]

    def barrier(self) -> None:
        """Return once every rank has called barrier."""
        self._check_open()
        rec = self.flight.issue("barrier", None, 0, None)
        try:
            self._backend.rendezvous("barrier", 0, 0)
        except BaseException as e:
            self.flight.fail(rec, e)
            raise
        self.flight.done(rec)

    def exchange(self, values: Sequence[int]) -> list[list[int]]:
        """Every rank's ``values`` (ints, the same count on every rank), in rank order: a small
        host handshake for layers above the communicator (e.g. :mod:`tilecomm.ops` checks
        that the ranks agree on shapes and dtypes). Runs on the host executor whatever device
        the caller's tensors are on; a different count of values raises CommMismatch."""
        self._check_open()
        # The same two buffers for every exchange of this length: small calls keep their
        # ready-made plan per buffer address, so fresh tensors would rebuild it every call
        # (41 us per exchange instead of 21 us, measured with 2 ranks).
        n = len(values)
        bufs = self._exchange_bufs.get(n)
        if bufs is None:
            bufs = self._exchange_bufs[n] = (
                torch.empty((n,), dtype=torch.int64),
                torch.empty((self.world_size * n,), dtype=torch.int64))
        t, out = bufs
        t.numpy()[:] = [int(v) for v in values]
        d = lookup_dtype(torch.int64)
        avail = self._backend.algorithms("all_gather")
        algo = "direct" if avail is None or "direct" in avail else \
            self._algo("all_gather", "auto", t.numel() * 8)     # across hosts: hier_*
        self._run(self._backend, "all_gather", algo, d, t.numel(),
                  {"in": buffer_for(self._backend, t, "exchange", write=False).flat,
                   "out": buffer_for(self._backend, out, "exchange", read=False).flat})
        return out.reshape(self.world_size, t.numel()).tolist()

    @property
    def cpu_kernels(self) -> str:
        """What runs collectives on CPU tensors: ``"executor"`` or ``"triton"`` (the GPU
        kernels in the interpreter; :meth:`use_cpu_kernels`, TILECOMM_CPU_KERNELS)."""
        be = self._backends.get("cpu")
        if be is None:
            from .settings import settings
            return settings().cpu_kernels
        return "executor" if be is self._backend else "triton"

    # ---- point-to-point -------------------------------------------------------------------
    def send(self, tensor: torch.Tensor, peer: int, tag: int = 0) -> None:
        """Send ``tensor`` to ``peer``; returns once ``peer`` has received it.

        Messages between two ranks are matched in posting order; ``tag`` is checked, not
        matched: a recv with another tag makes both sides raise :class:`CommMismatch`."""
        self._check_open()
        self._check_rank(peer, "send", "peer", not_self=True)
        d = self._dtype(tensor, "send")
        host_tensor(tensor, "send")
        rec = self.flight.issue("send", None, tensor.numel() * d.itemsize, d.name, peer=peer,
                                ordered=False)
        try:
            self._backend.send(Bytes(tensor, "send", write=False).flat, d, tensor.numel(),
                               peer, tag=int(tag))
        except BaseException as e:
            self.flight.fail(rec, e)
            raise
        self.flight.done(rec)

    def recv(self, tensor: torch.Tensor, peer: int, tag: int = 0) -> torch.Tensor:
        """Receive into ``tensor`` from ``peer`` (sizes and dtypes must match); returns it."""
        self._check_open()
        self._check_rank(peer, "recv", "peer", not_self=True)
        d = self._dtype(tensor, "recv")
        host_tensor(tensor, "recv")
        buf = Bytes(tensor, "recv", read=False)
        rec = self.flight.issue("recv", None, tensor.numel() * d.itemsize, d.name, peer=peer,
                                ordered=False)
        try:
            self._backend.recv(buf.flat, d, tensor.numel(), peer, tag=int(tag))
        except BaseException as e:
            self.flight.fail(rec, e)
            raise
        self.flight.done(rec)
        buf.finish()
        return tensor

    def probe(self, peer: int) -> bool:
        """True when a message from ``peer`` is waiting to be received (like ``MPI_Iprobe``)."""
        self._check_open()
        self._check_rank(peer, "probe", "peer", not_self=True)
        return self._backend.probe(peer)

    # ---- helpers --------------------------------------------------------------------------
    def _heap_bytes(self, t: torch.Tensor):
        """The segment's bytes under a contiguous symmetric tensor (None if not symmetric)."""
        ptr = t.data_ptr()
        if not self._heap_lo <= ptr < self._heap_hi:
            return None
        off = ptr - self._heap_lo + self._heap.layout.heap_offset
        return self._heap.segment(self._heap_rank)[off:off + t.numel() * t.element_size()]

    def _run(self, be: Backend, collective, algo, d: DType, count, buffers, **kw) -> None:
        self._run_prepared(be.prepare(CollectiveCall(collective, algo, d, count, buffers, **kw)))

    def _run_prepared(self, p: PreparedCall) -> None:
        """``p.run()``, recorded (NOTE [recording cost] in debug/flight.py)."""
        fl = self.flight
        call = p.call
        if not fl.enabled and fl.tracer is None:
            fl.next_seq += 1         # numbers stay the ranks' common count when re-enabled
            p.runner(call, p)
            return
        n = call.count * call.dtype.itemsize
        if call.send_rows is not None:
            n *= sum(call.send_rows)
        rec = fl.issue(call.collective, call.algo, n, call.dtype.name, call.root)
        try:
            p.runner(call, p)
        except BaseException as e:
            fl.fail(rec, e)
            raise
        fl.done(rec, note=call.info.get("auto"))

    # NOTE [device dispatch]: collectives go to the backend of the tensor's device type
    # (backends.base.DEVICE_BACKENDS: "cpu" -> the host executor, or the Triton kernels in the
    # interpreter under TILECOMM_CPU_KERNELS=triton; "cuda" -> the Triton kernels). A backend
    # is created on the first call that needs it; creating it is collective, which holds
    # because every rank makes the same calls in the same order.
    def _backend_for(self, t: torch.Tensor, what: str) -> Backend:
        return self._backend_for_device(t.device.type, what)

    def _backend_for_device(self, kind: str, what: str = "collective") -> Backend:
        """The backend for ``kind`` tensors, created on first use; ``what`` names the call
        in the errors."""
        be = self._backends.get(kind)
        if be is None:
            factory = DEVICE_BACKENDS.get(kind)
            if factory is None:
                raise TypeError(f"{what}: no backend for {kind} tensors; supported devices: "
                                f"{', '.join(DEVICE_BACKENDS)}")
            if kind == "cuda":
                # Said here, with the call's name: deeper down the CUDA heap's error speaks of
                # the device heap, which the caller of a collective never asked for.
                from .heap.cuda import cuda_unavailable_reason
                why = cuda_unavailable_reason()
                if why is not None:
                    raise NoDeviceError(
                        f"{what}: needs a CUDA GPU (device 'cuda'), but no CUDA GPU is "
                        f"available on this machine ({why}); use device='cpu' tensors, which "
                        f"the host executor runs")
            be = self._backends[kind] = factory(self)
        return be

    def use_cpu_kernels(self, kind: str) -> None:
        """Run collectives on CPU tensors with ``"executor"`` (the schedule executor, default)
        or ``"triton"`` (the GPU kernels in the Triton interpreter; for tests). Same as
        TILECOMM_CPU_KERNELS, per communicator. Collective when it creates the kernel backend."""
        from .backends.base import triton_backend

        if kind not in ("executor", "triton"):
            raise ValueError(f"use_cpu_kernels: kind must be 'executor' or 'triton', got {kind!r}")
        old = self._backends.get("cpu")
        want_triton = kind == "triton"
        if old is not None and (old is not self._backend) == want_triton:
            return
        retired = old is not None and old is not self._backend
        self.forget_calls()     # memoized calls name the engine they were validated for
        if retired:
            old.close()
        self._backends.pop("cpu", None)
        del old
        if retired:
            # The kernel backend's symmetric blocks return to the heap when its objects die,
            # and some sit in reference cycles: collected at a different moment on each rank,
            # they would leave the heaps out of step (the next alloc then finds them diverged).
            # Every rank switches at the same point of its calls, so collect here.
            gc.collect()
        self._backends["cpu"] = triton_backend(self, "cpu") if want_triton else self._backend

    @contextlib.contextmanager
    def _validating(self, collective: str, tensor=None):
        """Any error while checking arguments or preparing buffers is announced to the peers
        (so they raise instead of waiting) before being raised here."""
        self._check_open()
        try:
            yield
        except Exception as e:  # noqa: BLE001 - re-raised after telling the peers
            # The backend the call was going to announces it: the peers of an asynchronous
            # GPU backend are not waiting on the host (TritonBackend.reject). Only an existing
            # backend (the call may have just created it); creating one is collective.
            be = self._backends.get(tensor.device.type) \
                if isinstance(tensor, torch.Tensor) else None
            # the peers' message names the collective once (reject prefixes it)
            text = str(e).removeprefix(f"{collective}: ")
            kind = type(e).__name__
            self.flight.reject(collective, e, lambda: (be or self._backend).reject(
                collective, f"{kind}: {text}"))
            raise

    def _check_open(self) -> None:
        if self._closed:
            raise CommError("communicator is closed")

    def _dtype(self, t, what: str, op: ReduceOp | None = None) -> DType:
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{what}: expected a torch.Tensor, got {type(t).__name__}")
        if self.retired_heaps:
            self._check_not_retired(t, what)
        if t.device.type not in DEVICE_BACKENDS:
            raise TypeError(f"{what}: tensor is on {t.device}; collectives take tensors on "
                            f"{', '.join(DEVICE_BACKENDS)}")
        if t.layout != torch.strided:
            raise TypeError(f"{what}: {t.layout} tensors are not supported; pass a dense tensor "
                            f"(e.g. t.to_dense())")
        return lookup_dtype(t.dtype, op=op, what=what)

    def _algo(self, collective: str, algo: str, nbytes: int, be: Backend | None = None,
              d: DType | None = None, op: ReduceOp | None = None, root: int = 0,
              tensors: tuple = ()) -> str:
        """The algorithm a call runs: ``algo`` checked, or ``auto`` resolved by predicted cost
        (``tensors``: the call's, to tell heap memory from the caller's)."""
        be = be or self._backend
        avail = be.algorithms(collective)
        if self.deterministic and collective in _REDUCING:
            # NOTE [reduction order] (algorithms/lower.py): only schedules whose every output
            # is one rank-order reduction of the inputs give the reference's bits.
            ok = deterministic_algorithms(collective, self.world_size, root, among=avail)
            if algo != "auto" and algo in algorithms(collective) and algo not in ok:
                raise ValueError(
                    f"{collective}: algorithm {algo!r} does not reduce in rank order, so it "
                    f"cannot give the bits deterministic mode promises; deterministic "
                    f"algorithms here: {', '.join(ok) or 'none'} (or 'auto')")
            avail = ok
        if algo == "auto":
            if avail is None:       # the backend runs every registered algorithm
                avail = algorithms(collective)
            if d is not None:       # only candidates that take this dtype and op
                avail = [a for a in avail if _accepts(be, collective, a, d, op)]
            mem = "heap" if tensors and all(self._in_heap(t) for t in tensors) else "user"
            self.last_auto = tuner.decide(collective, nbytes, self.world_size, kind=be.kind,
                                          available=avail, mem=mem, layout=self.layout,
                                          root=root, model=self.costs)
            algo = self.last_auto.algo
        else:
            names = algorithms(collective) + [a for a in (be.algorithms(collective) or [])
                                              if a not in algorithms(collective)]
            if algo not in names:
                raise ValueError(f"{collective}: unknown algorithm {algo!r}; choose one of "
                                 f"{', '.join(names)} or 'auto'")
        if d is not None:
            be.check(collective, algo, d.torch, op)
        return algo

    def _auto_note(self, requested: str) -> dict:
        """The flight record's note of a call whose algorithm ``auto`` chose: why."""
        if requested != "auto" or self.last_auto is None:
            return {}
        return {"auto": f"auto: {self.last_auto.why()}"}

    def _in_heap(self, t) -> bool:
        """Whether ``t`` lies in this rank's symmetric heap (read in place, not staged)."""
        return t is not None and t.device.type == "cpu" and self._heap_bytes(t) is not None

    def _check_rank(self, r, what: str, name: str, not_self: bool = False) -> None:
        if not isinstance(r, int) or isinstance(r, bool) or not 0 <= r < self.world_size:
            raise ValueError(f"{what}: {name} must be an int in 0..{self.world_size - 1}, "
                             f"got {r!r}")
        if not_self and r == self.rank:
            raise ValueError(f"{what}: {name} {r} is this rank; pick another rank")

    def _check_rows(self, t: torch.Tensor, what: str) -> None:
        if t.dim() == 0 or t.shape[0] % self.world_size:
            rows = t.shape[0] if t.dim() else "a 0-d tensor"
            raise ValueError(f"{what}: dim 0 ({rows}) must be a multiple of world_size "
                             f"({self.world_size}); pad it or use all_to_all_v")

    def _counts(self, counts, name: str) -> list[int]:
        vals = [int(c) for c in counts]
        if len(vals) != self.world_size or any(c < 0 for c in vals):
            raise ValueError(f"all_to_all_v: {name} needs {self.world_size} non-negative "
                             f"counts, got {list(counts)}")
        return vals

    def retire(self, old: "Communicator") -> None:
        """Refuse tensors of ``old``'s symmetric heap (and of those it replaced) from now on:
        this communicator replaces it (shrink, grow)."""
        # only heaps still mapped can hold tensors: the list stays short over many shrinks
        # (every call checks it)
        self.retired_heaps = [h for h in old.retired_heaps + [old.host.heap]
                              if getattr(h, "mapped", False)]

    def _check_not_retired(self, t: torch.Tensor, what: str) -> None:
        ptr = t.data_ptr()
        # a released heap's addresses may hold other memory now (this one's heap among them):
        # only a heap still mapped can hold its tensors
        if t.device.type == "cpu" and any(h.maps(ptr) for h in self.retired_heaps):
            raise ValueError(f"{what}: the tensor lies in the symmetric heap of the "
                             f"communicator this one replaced (shrink / grow); it is not "
                             f"symmetric here: copy it out, or allocate with this "
                             f"communicator's alloc")

    def _out(self, out, shape, like: torch.Tensor, what: str) -> torch.Tensor:
        dtype = like.dtype
        if out is None:
            return torch.empty(shape, dtype=dtype, device=like.device)
        if not isinstance(out, torch.Tensor) or tuple(out.shape) != tuple(shape):
            got = tuple(out.shape) if isinstance(out, torch.Tensor) else type(out).__name__
            raise ValueError(f"{what}: out must have shape {tuple(shape)}, got {got}")
        if out.dtype != dtype or out.device != like.device:
            raise TypeError(f"{what}: out must be a {dtype} tensor on {like.device}, got "
                            f"{out.dtype} on {out.device}")
        if self.retired_heaps:
            self._check_not_retired(out, what)
        return out


def _accepts(be: Backend, collective: str, algo: str, d: DType, op) -> bool:
    """Whether ``be`` runs ``algo`` on this dtype and op (``auto`` offers only those)."""
    try:
        be.check(collective, algo, d.torch, op)
    except (ValueError, TypeError):
        return False
    return True

"""Communicator: the user-facing object. Validates every call, picks the algorithm, dispatches.

Every collective must be called by all ranks in the same order with matching arguments. A call
a rank rejects (bad argument) is announced to the peers, so every rank raises instead of waiting;
ranks that disagree (collective, count, dtype, op, root, algorithm) all raise
:class:`~tilecomm.CommMismatch`; a peer that never arrives makes the waiters raise
:class:`~tilecomm.CommTimeout` after ``timeout`` seconds.
"""

from __future__ import annotations

import contextlib
import weakref
from typing import Sequence

import numpy as np
import torch

from . import tuner
from .algorithms.registry import algorithms
from .backends.base import Backend, CollectiveCall
from .errors import CommError
from .heap.allocator import HeapAllocator
from .types import DType, ReduceOp, lookup_dtype


_MEMO_ENTRIES = 16
_MEMO_BYTES = 1 << 20


class Communicator:
    """A group of ``world_size`` ranks that exchange CPU tensors through a symmetric heap.

    Create one with :func:`tilecomm.launch` (local processes) or :func:`tilecomm.init`
    (under torchrun); do not construct it directly.
    """

    def __init__(self, backend: Backend, heap, *, timeout: float):
        self.rank = backend.rank
        self.world_size = backend.world_size
        self.timeout = timeout
        self._backend = backend
        self._heap = heap
        lay = heap.layout
        self._alloc = HeapAllocator(lay.heap_offset, lay.heap_bytes)
        self._closed = False
        self._memos: dict = {}

    # ---- lifecycle ------------------------------------------------------------------------
    def close(self) -> None:
        """Release this rank's mappings. Tensors from :meth:`alloc` must not be used after."""
        if not self._closed:
            self._closed = True
            self._memos.clear()
            self._backend.close()

    def __enter__(self) -> "Communicator":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"Communicator(rank={self.rank}, world_size={self.world_size})"

    # ---- symmetric memory -----------------------------------------------------------------
    def alloc(self, shape: int | Sequence[int], dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """A zero-filled tensor in symmetric memory (collective: all ranks, same order/sizes).

        Collectives on it read it where it is (no staging copy); :meth:`peer` views a peer's copy.
        """
        shape = (shape,) if isinstance(shape, int) else tuple(shape)
        with self._validating("alloc"):
            d = lookup_dtype(dtype, what="alloc")
            if any((not isinstance(s, int)) or s < 0 for s in shape):
                raise ValueError(f"alloc: shape must be non-negative ints, got {shape}")
            nbytes = int(np.prod(shape, dtype=np.int64)) * d.itemsize
            off = self._alloc.alloc(nbytes)
        try:
            offsets = self._backend.rendezvous("alloc", nbytes, off)
        except BaseException:
            self._alloc.free(off)
            raise
        if len(set(offsets)) > 1:
            self._alloc.free(off)
            raise CommError(f"alloc: symmetric heap diverged (offsets {offsets}); free symmetric "
                            f"tensors in the same order on every rank")
        raw = self._heap.block(self.rank, off, nbytes)
        raw[:] = 0
        weakref.finalize(raw.base, self._alloc.free, off)  # runs when the last view is gone
        return _as_tensor(raw, d).reshape(shape)

    def peer(self, tensor: torch.Tensor, rank: int) -> torch.Tensor:
        """View of ``rank``'s copy of the symmetric ``tensor`` (same offset in its segment)."""
        self._check_rank(rank, "peer", "rank")
        raw = _raw_bytes(tensor, "peer", writable_copy=False)
        off = self._heap.offset_of(raw)
        if off is None or off < self._heap.layout.heap_offset:
            raise ValueError("peer: tensor is not in symmetric memory; allocate it with "
                             "comm.alloc")
        d = lookup_dtype(tensor.dtype, what="peer")
        praw = self._heap.segment(rank)[off:off + raw.nbytes]
        return _as_tensor(praw, d).reshape(tensor.shape)

    # ---- collectives ----------------------------------------------------------------------
    def all_reduce(self, tensor: torch.Tensor, op="sum", *, algo: str = "auto") -> torch.Tensor:
        """Reduce ``tensor`` over all ranks, in place; returns ``tensor``."""
        memo = self._memo("all_reduce", tensor, op, algo, 0)
        if memo is not None:   # the same small call again: skip validation and view-making
            self._backend.run(memo)
            return tensor
        with self._validating("all_reduce"):
            rop = ReduceOp.parse(op)
            d = self._dtype(tensor, "all_reduce", rop)
            algo = self._algo("all_reduce", algo, tensor.numel() * d.itemsize)
        with _inout(tensor) as flat:
            self._remember("all_reduce", tensor, op, algo, 0, flat, d, rop)
            self._run("all_reduce", algo, d, tensor.numel(), {"buf": flat}, op=rop)
        return tensor

    def all_gather(self, tensor: torch.Tensor, out: torch.Tensor | None = None, *,
                   algo: str = "auto") -> torch.Tensor:
        """Concatenate every rank's ``tensor`` along dim 0, in rank order.

        Returns ``out`` of shape ``(world_size * tensor.shape[0], *tensor.shape[1:])``.
        """
        w = self.world_size
        with self._validating("all_gather"):
            d = self._dtype(tensor, "all_gather")
            shape = (w * tensor.shape[0], *tensor.shape[1:]) if tensor.dim() else (w,)
            out = self._out(out, shape, tensor.dtype, "all_gather")
            algo = self._algo("all_gather", algo, out.numel() * d.itemsize)
        with _inout(out, read=False) as oflat:
            self._run("all_gather", algo, d, tensor.numel(),
                      {"in": _raw_bytes(tensor, "all_gather"), "out": oflat})
        return out

    def reduce_scatter(self, tensor: torch.Tensor, op="sum", out: torch.Tensor | None = None, *,
                       algo: str = "auto") -> torch.Tensor:
        """Reduce over ranks and keep this rank's ``tensor.shape[0] // world_size`` rows."""
        w = self.world_size
        with self._validating("reduce_scatter"):
            rop = ReduceOp.parse(op)
            d = self._dtype(tensor, "reduce_scatter", rop)
            self._check_rows(tensor, "reduce_scatter")
            out = self._out(out, (tensor.shape[0] // w, *tensor.shape[1:]), tensor.dtype,
                            "reduce_scatter")
            algo = self._algo("reduce_scatter", algo, tensor.numel() * d.itemsize)
        with _inout(out, read=False) as oflat:
            self._run("reduce_scatter", algo, d, tensor.numel(),
                      {"in": _raw_bytes(tensor, "reduce_scatter"), "out": oflat}, op=rop)
        return out

    def broadcast(self, tensor: torch.Tensor, root: int = 0, *, algo: str = "auto") -> torch.Tensor:
        """Copy ``root``'s ``tensor`` into every rank's ``tensor``; returns ``tensor``."""
        memo = self._memo("broadcast", tensor, None, algo, root)
        if memo is not None:
            self._backend.run(memo)
            return tensor
        with self._validating("broadcast"):
            self._check_rank(root, "broadcast", "root")
            d = self._dtype(tensor, "broadcast")
            algo = self._algo("broadcast", algo, tensor.numel() * d.itemsize)
        with _inout(tensor) as flat:
            self._remember("broadcast", tensor, None, algo, root, flat, d, None)
            self._run("broadcast", algo, d, tensor.numel(), {"buf": flat}, root=root)
        return tensor

    def reduce(self, tensor: torch.Tensor, root: int = 0, op="sum", *,
               algo: str = "auto") -> torch.Tensor:
        """Reduce into ``root``'s ``tensor`` (other ranks' tensors are left unchanged)."""
        memo = self._memo("reduce", tensor, op, algo, root)
        if memo is not None:
            self._backend.run(memo)
            return tensor
        with self._validating("reduce"):
            self._check_rank(root, "reduce", "root")
            rop = ReduceOp.parse(op)
            d = self._dtype(tensor, "reduce", rop)
            algo = self._algo("reduce", algo, tensor.numel() * d.itemsize)
        with _inout(tensor) as flat:
            self._remember("reduce", tensor, op, algo, root, flat, d, rop)
            self._run("reduce", algo, d, tensor.numel(), {"buf": flat}, op=rop, root=root)
        return tensor

    def all_to_all(self, tensor: torch.Tensor, out: torch.Tensor | None = None, *,
                   algo: str = "auto") -> torch.Tensor:
        """Block ``j`` of ``tensor`` (dim 0 cut in ``world_size``) goes to rank ``j``; ``out``
        holds, in rank order, the block each rank sent here."""
        with self._validating("all_to_all"):
            d = self._dtype(tensor, "all_to_all")
            self._check_rows(tensor, "all_to_all")
            out = self._out(out, tuple(tensor.shape), tensor.dtype, "all_to_all")
            algo = self._algo("all_to_all", algo, tensor.numel() * d.itemsize)
        with _inout(out, read=False) as oflat:
            self._run("all_to_all", algo, d, tensor.numel(),
                      {"in": _raw_bytes(tensor, "all_to_all"), "out": oflat})
        return out

    def all_to_all_v(self, tensor: torch.Tensor, send_counts: Sequence[int],
                     recv_counts: Sequence[int] | None = None, *,
                     algo: str = "auto") -> torch.Tensor:
        """Uneven all-to-all along dim 0: ``send_counts[j]`` rows go to rank ``j``.

        Returns the received rows, in rank order, shape ``(sum(recv_counts), *tensor.shape[1:])``.
        ``recv_counts`` is optional (learned from the peers); when given it is checked.
        """
        w = self.world_size
        with self._validating("all_to_all_v"):
            d = self._dtype(tensor, "all_to_all_v")
            if tensor.dim() == 0:
                raise ValueError("all_to_all_v: tensor needs at least one dimension")
            send = self._counts(send_counts, "send_counts")
            if sum(send) != tensor.shape[0]:
                raise ValueError(f"all_to_all_v: send_counts sum to {sum(send)} but tensor has "
                                 f"{tensor.shape[0]} rows")
            recv = None if recv_counts is None else self._counts(recv_counts, "recv_counts")
            algo = self._algo("all_to_all_v", algo, tensor.numel() * d.itemsize)
        rest = tuple(tensor.shape[1:])
        row = int(np.prod(rest, dtype=np.int64))
        holder: list[torch.Tensor] = []

        def make_out(rows: int) -> np.ndarray:
            holder.append(torch.empty((rows, *rest), dtype=tensor.dtype))
            return _raw_bytes(holder[-1], "all_to_all_v")

        bufs = {"in": _raw_bytes(tensor, "all_to_all_v")}
        if recv is not None:
            bufs["out"] = make_out(sum(recv))
        self._run("all_to_all_v", algo, d, row, bufs, send_rows=send, recv_rows=recv,
                  make_out=make_out)
        return holder[-1]

    def barrier(self) -> None:
        """Return once every rank has called barrier."""
        self._check_open()
        self._backend.rendezvous("barrier", 0, 0)

    # ---- point-to-point -------------------------------------------------------------------
    def send(self, tensor: torch.Tensor, peer: int) -> None:
        """Send ``tensor`` to ``peer``; returns once ``peer`` has received it."""
        self._check_open()
        self._check_rank(peer, "send", "peer", not_self=True)
        d = self._dtype(tensor, "send")
        self._backend.send(_raw_bytes(tensor, "send"), d, tensor.numel(), peer)

    def recv(self, tensor: torch.Tensor, peer: int) -> torch.Tensor:
        """Receive into ``tensor`` from ``peer`` (sizes and dtypes must match); returns it."""
        self._check_open()
        self._check_rank(peer, "recv", "peer", not_self=True)
        d = self._dtype(tensor, "recv")
        with _inout(tensor, read=False) as flat:
            self._backend.recv(flat, d, tensor.numel(), peer)
        return tensor

    # ---- helpers --------------------------------------------------------------------------
    # NOTE [call memo]: latency-bound programs repeat the same small in-place call on the same
    # tensor. The memo maps (data pointer, dtype, numel, op, algo, root) to the validated call,
    # holding a view of the tensor (at most _MEMO_ENTRIES tensors of <= _MEMO_BYTES each, so a
    # cached pointer can never be reused by another tensor while its entry lives).
    def _memo(self, name, t, op, algo, root):
        if type(t) is not torch.Tensor or not t.is_cpu or not t.is_contiguous():
            return None
        try:
            return self._memos.get((name, t.data_ptr(), t.dtype, t.numel(), op, algo, root))
        except TypeError:   # unhashable op
            return None

    def _remember(self, name, t, op, algo_in, root, flat, d, rop) -> None:
        if not t.is_contiguous() or flat.nbytes > _MEMO_BYTES or type(t) is not torch.Tensor:
            return
        try:
            key = (name, t.data_ptr(), t.dtype, t.numel(), op, algo_in, root)
            hash(key)
        except TypeError:
            return
        if len(self._memos) >= _MEMO_ENTRIES:
            self._memos.pop(next(iter(self._memos)))
        self._memos[key] = CollectiveCall(name, self._algo(name, algo_in, flat.nbytes), d,
                                          t.numel(), {"buf": flat}, op=rop, root=root,
                                          cache_key=key)

    def _run(self, collective, algo, d: DType, count, buffers, **kw) -> None:
        self._backend.run(CollectiveCall(collective, algo, d, count, buffers, **kw))

    @contextlib.contextmanager
    def _validating(self, collective: str):
        """Argument errors are announced to the peers before being raised here."""
        self._check_open()
        try:
            yield
        except (ValueError, TypeError, MemoryError) as e:
            self._backend.reject(collective, f"{type(e).__name__}: {e}")
            raise

    def _check_open(self) -> None:
        if self._closed:
            raise CommError("communicator is closed")

    def _dtype(self, t, what: str, op: ReduceOp | None = None) -> DType:
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{what}: expected a torch.Tensor, got {type(t).__name__}")
        if t.device.type != "cpu":
            raise TypeError(f"{what}: tensor is on {t.device}; this communicator moves CPU "
                            f"tensors (GPU kernels are a separate backend)")
        return lookup_dtype(t.dtype, op=op, what=what)

    def _algo(self, collective: str, algo: str, nbytes: int) -> str:
        if algo == "auto":
            return tuner.choose(collective, nbytes, self.world_size)
        names = algorithms(collective)
        if algo not in names:
            raise ValueError(f"{collective}: unknown algorithm {algo!r}; choose one of "
                             f"{', '.join(names)} or 'auto'")
        return algo

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

    @staticmethod
    def _out(out, shape, dtype, what: str) -> torch.Tensor:
        if out is None:
            return torch.empty(shape, dtype=dtype)
        if not isinstance(out, torch.Tensor) or tuple(out.shape) != tuple(shape):
            got = tuple(out.shape) if isinstance(out, torch.Tensor) else type(out).__name__
            raise ValueError(f"{what}: out must have shape {tuple(shape)}, got {got}")
        if out.dtype != dtype or out.device.type != "cpu":
            raise TypeError(f"{what}: out must be a CPU {dtype} tensor, got {out.dtype} on "
                            f"{out.device}")
        return out


def _raw_bytes(t: torch.Tensor, what: str, writable_copy: bool = True) -> np.ndarray:
    """Flat uint8 numpy view of a contiguous tensor (a contiguous copy for others)."""
    if not t.is_contiguous():
        if not writable_copy:
            raise ValueError(f"{what}: tensor must be contiguous")
        t = t.contiguous()
    return t.detach().reshape(-1).view(torch.uint8).numpy()


def _as_tensor(raw: np.ndarray, d: DType) -> torch.Tensor:
    """A torch tensor of dtype ``d`` sharing the memory of the uint8 array ``raw``."""
    if d.numpy is not None:
        return torch.from_numpy(raw.view(d.numpy))
    return torch.from_numpy(raw.view(np.int16)).view(d.torch)


@contextlib.contextmanager
def _inout(t: torch.Tensor, read: bool = True):
    """Flat bytes of ``t`` to write into; a non-contiguous ``t`` gets a copy written back."""
    if t.is_contiguous():
        yield t.detach().reshape(-1).view(torch.uint8).numpy()
        return
    tmp = t.detach().contiguous() if read else torch.empty_like(t, memory_format=torch.contiguous_format)
    yield tmp.reshape(-1).view(torch.uint8).numpy()
    with torch.no_grad():
        t.copy_(tmp)

"""Validated calls kept for reuse: one object (:class:`CallMemo`) holds every call the
Communicator skips validating, as the :class:`~tilecomm.backends.base.PreparedCall` its
backend made, and one method forgets them all.

NOTE [call memo]: latency-bound programs repeat the same small in-place call on the same
tensor. The memo maps (data pointer, dtype, numel, op, requested algo, root) to the validated
call, holding a view of the tensor (at most ``ENTRIES`` tensors of at most ``MAX_BYTES`` each,
so a cached pointer can never be reused by another tensor while its entry lives). The last
in-place call is also kept by tensor identity, for a tensor of any size: a call on a
cache-sized message leaves the interpreter's own memory cold, and skipping validation then
saves tens of microseconds; a large tensor's entry holds a view of its memory, so it is
dropped when the tensor dies. A symmetric tensor is held as a view of the segment, not of its
block: a block kept alive on one rank only would make the heaps diverge, and a pointer reused
by a new block names the same memory anyway.

NOTE [pair memo]: all_gather, reduce_scatter and all_to_all called again with the same input
and the same given ``out`` (what a decode step does) reuse the validated call: the tensors'
identity, data pointers, shapes and dtypes, the op and the requested algorithm must all
match, and both must still be contiguous. The entry dies with either tensor. A call that
allocates its output, or stages a non-contiguous tensor, is not kept.
"""

from __future__ import annotations

import weakref

import torch

#: small in-place calls kept by key, and the largest of them
ENTRIES = 16
MAX_BYTES = 1 << 20


def memo_key(name, t, op, algo, root):
    """An in-place call's memo key (any size), or None when it cannot be kept (not a plain
    contiguous CPU tensor, or an unhashable op)."""
    if type(t) is not torch.Tensor or not t.is_cpu or not t.is_contiguous():
        return None
    key = (name, t.data_ptr(), t.dtype, t.numel(), op, algo, root)
    try:
        hash(key)
    except TypeError:   # unhashable op
        return None
    return key


class CallMemo:
    """The Communicator's kept calls (module docstring). ``last`` and ``pair`` are one-element
    lists so that a tensor's weak reference callback can clear them."""

    def __init__(self):
        self.small: dict = {}
        #: [(weak ref to the tensor, key, prepared call)] or [None]: the last in-place call,
        #: which the Communicator checks itself (its hottest path)
        self.last: list = [None]
        #: [(weak refs to input and output, key, prepared call)] or [None]
        self.pair: list = [None]

    def forget(self) -> None:
        """Forget every kept call (and with them what their backends built for them)."""
        self.small.clear()
        self.last[0] = None
        self.pair[0] = None

    # ---- in place (all_reduce, broadcast, reduce) --------------------------------------------
    def small_call(self, key, nbytes: int):
        """The prepared call kept under ``key`` (a small call), or None."""
        return self.small.get(key) if nbytes <= MAX_BYTES else None

    def keep(self, tensor, key, p, nbytes: int, staged: bool) -> None:
        """Keep a validated in-place call: by key when small, and as the last one unless its
        tensor was staged (a non-contiguous tensor's copy)."""
        if nbytes <= MAX_BYTES:
            if len(self.small) >= ENTRIES:
                self.small.pop(next(iter(self.small)))
            self.small[key] = p
        if not staged:
            self.remember(tensor, key, p)

    def remember(self, tensor, key, p) -> None:
        """Make ``p`` the last in-place call (held by a weak reference to its tensor)."""
        holder = self.last

        def forget(ref, holder=holder):
            if holder[0] is not None and holder[0][0] is ref:
                holder[0] = None
        holder[0] = (weakref.ref(tensor, forget), key, p)

    # ---- two buffers (all_gather, reduce_scatter, all_to_all) --------------------------------
    def pair_call(self, name, tensor, out, op, algo):
        """The prepared call of ``name(tensor, out=out)`` if it is the kept pair, else None."""
        last = self.pair[0]
        if last is None or out is None or last[0]() is not tensor or last[1]() is not out:
            return None
        (n, o, a, ip, op_, it, ot, ish, osh), p = last[2:]
        if (n == name and o == op and a == algo and ip == tensor.data_ptr()
                and op_ == out.data_ptr() and it == tensor.dtype and ot == out.dtype
                and ish == tensor.shape and osh == out.shape and tensor.is_contiguous()
                and out.is_contiguous()):
            return p
        return None

    @staticmethod
    def pair_key(name, tensor, out, op, algo, staged: bool):
        """The key of a validated two-buffer call, or None if it is not kept (no given
        ``out``, a staged buffer, or a tensor the in-place memo would not keep either)."""
        if (out is None or staged or type(out) is not torch.Tensor or not out.is_cpu
                or memo_key(name, tensor, op, algo, 0) is None):
            return None
        return (name, op, algo, tensor.data_ptr(), out.data_ptr(), tensor.dtype, out.dtype,
                tensor.shape, out.shape)

    def keep_pair(self, tensor, out, key, p) -> None:
        holder = self.pair

        def forget(ref, holder=holder):
            if holder[0] is not None and ref in (holder[0][0], holder[0][1]):
                holder[0] = None
        holder[0] = (weakref.ref(tensor, forget), weakref.ref(out, forget), key, p)

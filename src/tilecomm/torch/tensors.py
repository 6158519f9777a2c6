"""Turning torch.distributed's tensors into what the Communicator moves, and back.

The Communicator reduces six dtypes and moves two more; torch.distributed hands a backend any
dtype (bool, int16, complex, float8...). Data movement does not care about dtype, so any tensor
moves as its bytes. Reductions the Communicator cannot do natively (bitwise ops, int8, bool,
complex products...) take the reference path: gather every rank's bytes and reduce them with
torch in rank order, the same on every rank.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from ..types import DTYPES, ReduceOp, flat_view

RedOpType = dist.ReduceOp.RedOpType

NATIVE_OPS = {RedOpType.SUM: ReduceOp.SUM, RedOpType.AVG: ReduceOp.AVG,
              RedOpType.PRODUCT: ReduceOp.PROD, RedOpType.MIN: ReduceOp.MIN,
              RedOpType.MAX: ReduceOp.MAX}
BITWISE_OPS = {RedOpType.BAND: torch.bitwise_and, RedOpType.BOR: torch.bitwise_or,
               RedOpType.BXOR: torch.bitwise_xor}


def _avg_add(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """AVG's fold step; ``reduce_parts`` divides by the number of ranks at the end."""
    return torch.add(a, b)


REFERENCE_FN = {ReduceOp.SUM: torch.add, ReduceOp.AVG: _avg_add, ReduceOp.PROD: torch.mul,
                ReduceOp.MIN: torch.minimum, ReduceOp.MAX: torch.maximum}


def check_tensor(t, collective: str, what: str = "tensor") -> torch.Tensor:
    """``t`` if this backend can move it; otherwise an error naming the collective and why."""
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"tilecomm backend: {collective}: {what} must be a torch.Tensor, "
                        f"got {type(t).__name__}")
    if t.device.type != "cpu":
        raise RuntimeError(f"tilecomm backend: {collective} on a {t.device.type} tensor is not "
                           f"supported: the tilecomm process group moves CPU tensors only "
                           f"(for CUDA tensors use the 'nccl' backend)")
    if t.layout != torch.strided:
        raise RuntimeError(f"tilecomm backend: {collective} on a {t.layout} tensor is not "
                           f"supported; pass a dense tensor (t.to_dense())")
    return t


class Flat:
    """A 1-D view of a tensor in a dtype the Communicator moves (its own dtype when supported,
    else its bytes), with a contiguous copy for non-contiguous tensors.

    ``x``: the flat tensor to hand to the Communicator; ``finish()`` writes it back when it was a
    copy and ``write`` is set.
    """

    __slots__ = ("tensor", "tmp", "x", "write")

    def __init__(self, t: torch.Tensor, *, read: bool = True, write: bool = True,
                 as_bytes: bool = False):
        self.tensor, self.tmp, self.write = t, None, write
        src = t
        if not t.is_contiguous():
            self.tmp = src = (t.detach().contiguous() if read else
                              torch.empty_like(t, memory_format=torch.contiguous_format))
        flat = flat_view(src)
        if as_bytes or t.dtype not in DTYPES:
            flat = flat.view(torch.uint8)
        self.x = flat

    def finish(self) -> None:
        if self.tmp is not None and self.write:
            with torch.no_grad():
                self.tensor.copy_(self.tmp)


_PLANS: dict = {}


def known_plan(t: torch.Tensor, opts_op):
    """The decided plan for ``t`` under torch's op, or None if it was never decided (a
    lookup that cannot raise: the fast path of a repeated call)."""
    return _PLANS.get((t.dtype, getattr(opts_op, "op", opts_op)))


def reduce_plan(t: torch.Tensor, opts_op, collective: str):
    """How to reduce ``t`` under torch's op: ``("native", ReduceOp, view)`` when the
    Communicator can do it (complex sums as float pairs), else ``("reference", fn, None)``.

    Raises ``TypeError``/``ValueError`` naming the collective for combinations no backend defines.
    """
    op = getattr(opts_op, "op", opts_op)
    key = (t.dtype, op)
    plan = _PLANS.get(key)     # small calls are latency-bound: decide once per (dtype, op)
    if plan is None:
        plan = _PLANS[key] = _decide(t, op, collective)
    return plan


def _decide(t: torch.Tensor, op, collective: str):
    if op == RedOpType.PREMUL_SUM:
        raise ValueError(f"tilecomm backend: {collective}: PREMUL_SUM is not supported (it is an "
                         f"NCCL extension); scale the tensor and use SUM")
    if op in BITWISE_OPS:
        if t.is_floating_point() or t.is_complex():
            raise TypeError(f"tilecomm backend: {collective}: {op.name} needs an integer or bool "
                            f"tensor, got {t.dtype}")
        return "reference", BITWISE_OPS[op], None
    rop = NATIVE_OPS.get(op)
    if rop is None:
        raise ValueError(f"tilecomm backend: {collective}: unknown reduce op {op!r}")
    if t.is_complex():
        if rop in (ReduceOp.MIN, ReduceOp.MAX):
            raise TypeError(f"tilecomm backend: {collective}: {rop.name} is not defined for "
                            f"complex tensors ({t.dtype})")
        if rop in (ReduceOp.SUM, ReduceOp.AVG):
            return "native", rop, torch.view_as_real
        return "reference", REFERENCE_FN[rop], None
    d = DTYPES.get(t.dtype)
    if rop is ReduceOp.AVG and not t.is_floating_point():
        raise TypeError(f"tilecomm backend: {collective}: AVG needs a floating-point tensor, got "
                        f"{t.dtype}")
    if d is not None and d.reducible:
        return "native", rop, None
    return "reference", REFERENCE_FN[rop], None


def reduce_parts(parts: list[torch.Tensor], fn) -> torch.Tensor:
    """Reference reduction: fold ``parts`` (one per rank, same dtype) in rank order.

    float8 tensors have no arithmetic on CPU: they fold in float32 and round once at the end
    (the same on every rank). AVG divides the sum by the number of ranks.
    """
    dtype = parts[0].dtype
    wide = torch.float32 if dtype.is_floating_point and dtype.itemsize == 1 else dtype
    acc = parts[0].to(wide, copy=True)
    for p in parts[1:]:
        acc = fn(acc, p.to(wide)).to(wide)
    if fn is _avg_add:
        acc = acc / len(parts)
    return acc.to(dtype)

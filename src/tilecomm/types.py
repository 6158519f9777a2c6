"""Reduction ops and supported dtypes, and the arithmetic the CPU executor applies to them."""

from __future__ import annotations

import enum
from dataclasses import dataclass
from functools import cached_property
from typing import Any

import numpy as np
import torch


class ReduceOp(enum.Enum):
    """Reduction applied by all_reduce, reduce and reduce_scatter. Strings ``"sum"`` etc. work too."""

    SUM = "sum"
    PROD = "prod"
    MIN = "min"
    MAX = "max"
    AVG = "avg"

    @classmethod
    def parse(cls, op: Any, what: str = "") -> "ReduceOp":
        """``op`` as a ReduceOp; ``ValueError`` naming ``what`` (the collective) if unknown."""
        if isinstance(op, cls):
            return op
        if isinstance(op, str):
            try:
                return cls(op.lower())
            except ValueError:
                pass
        name = getattr(op, "name", None)  # torch.distributed.ReduceOp.SUM and friends
        if isinstance(name, str) and name.lower() in cls._value2member_map_:
            return cls(name.lower())
        raise ValueError(f"{what + ': ' if what else ''}unknown reduction op {op!r}; use one of "
                         f"{', '.join(m.value for m in cls)}")


@dataclass(frozen=True)
class DType:
    """How the CPU executor handles one torch dtype."""

    torch: torch.dtype
    id: int                      # stable small integer (exchanged between ranks)
    numpy: Any                   # numpy dtype for arithmetic, or None: use torch ops
    itemsize: int
    reducible: bool              # False: data movement only

    @cached_property            # read by the flight recorder on every call
    def name(self) -> str:
        return str(self.torch).removeprefix("torch.")


DTYPES: dict[torch.dtype, DType] = {d.torch: d for d in [
    DType(torch.float32, 1, np.float32, 4, True),
    DType(torch.float64, 2, np.float64, 8, True),
    DType(torch.float16, 3, None, 2, True),     # numpy's float16 math is scalar; torch vectorizes
    DType(torch.bfloat16, 4, None, 2, True),    # numpy has no bfloat16
    DType(torch.int32, 5, np.int32, 4, True),
    DType(torch.int64, 6, np.int64, 8, True),
    DType(torch.uint8, 7, np.uint8, 1, False),
    DType(torch.int8, 8, np.int8, 1, False),
]}
DTYPE_BY_ID = {d.id: d for d in DTYPES.values()}
DTYPE_BY_NAME = {d.name: d for d in DTYPES.values()}

NP_UFUNC = {ReduceOp.SUM: np.add, ReduceOp.AVG: np.add, ReduceOp.PROD: np.multiply,
             ReduceOp.MIN: np.minimum, ReduceOp.MAX: np.maximum}
TORCH_FN = {ReduceOp.SUM: torch.add, ReduceOp.AVG: torch.add, ReduceOp.PROD: torch.mul,
             ReduceOp.MIN: torch.minimum, ReduceOp.MAX: torch.maximum}
OP_ID = {op: i for i, op in enumerate(ReduceOp, start=1)}
OP_BY_ID = {i: op for op, i in OP_ID.items()}


def lookup_dtype(dtype: torch.dtype, *, op: ReduceOp | None = None, what: str = "") -> DType:
    """The :class:`DType` for ``dtype``; ``TypeError`` saying what to change when unsupported."""
    d = DTYPES.get(dtype)
    if d is None:
        names = ", ".join(x.name for x in DTYPES.values())
        raise TypeError(f"{what}: dtype {dtype} is not supported; use one of {names}")
    if op is not None:
        if not d.reducible:
            raise TypeError(f"{what}: {d.name} supports data movement only, not reduction "
                            f"{op.value!r}; cast to int32 or a float type")
        if op is ReduceOp.AVG and not (d.torch.is_floating_point):
            raise TypeError(f"{what}: op 'avg' needs a floating dtype, got {d.name}; use 'sum' "
                            f"and divide, or cast to float")
    return d


def flat_view(t: torch.Tensor) -> torch.Tensor:
    """The 1-D view (no copy) of a tensor that ``t.is_contiguous()`` accepts.

    ``t.reshape(-1)`` keeps the stride of a tensor with at most one element (``torch.ones(2)
    [::2]`` has stride 2, and torch calls it contiguous), and such a view cannot be
    reinterpreted as bytes; with one element the stride is never used, so this view says 1.
    """
    return t.detach().as_strided((t.numel(),), (1,))


def typed_view(raw: np.ndarray, d: DType):
    """View a uint8 array as ``d``: a numpy array, or a torch tensor for the torch-math dtypes."""
    if d.numpy is not None:
        return raw.view(d.numpy)
    return torch.from_numpy(raw.view(np.int16)).view(d.torch)


def combine(out, a, b, op: ReduceOp) -> None:
    """``out = a (op) b`` elementwise; ``out`` may alias ``a`` or ``b``."""
    if isinstance(out, np.ndarray):
        NP_UFUNC[op](a, b, out=out)
    else:
        TORCH_FN[op](a, b, out=out)


def scale_avg(out, world_size: int) -> None:
    """Finish an ``avg`` reduction in place: divide the sum by the world size."""
    if isinstance(out, np.ndarray):
        np.divide(out, world_size, out=out)
    else:
        out.div_(world_size)

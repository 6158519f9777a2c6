"""Pieces shared by the collective kernels (imports triton)."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

OP_SUM, OP_AVG, OP_MIN, OP_MAX, OP_PROD = 0, 1, 2, 3, 4
OP_CODE = {"sum": OP_SUM, "avg": OP_AVG, "min": OP_MIN, "max": OP_MAX, "prod": OP_PROD}

#: Triton signature names of the torch dtypes the kernels take
TL_NAME = {torch.float32: "fp32", torch.float16: "fp16", torch.bfloat16: "bf16",
           torch.float64: "fp64", torch.int32: "i32", torch.int64: "i64"}


def op_code(call) -> int:
    return OP_SUM if call.op is None else OP_CODE[call.op.value]


def acc_f32(dtype: torch.dtype) -> int:
    """1: accumulate in fp32 (fp16, bf16); 0: in the dtype itself."""
    return int(dtype in (torch.float16, torch.bfloat16))


@triton.jit
def load_acc(ptr, mask, ACC_F32: tl.constexpr):
    """Load a block, widened to fp32 when ACC_F32."""
    v = tl.load(ptr, mask=mask, other=0)
    if ACC_F32:
        v = v.to(tl.float32)
    return v


@triton.jit
def combine(acc, v, OP: tl.constexpr):
    """``acc (op) v``; avg sums (finish divides)."""
    if OP == 2:
        r = tl.minimum(acc, v, propagate_nan=tl.PropagateNan.ALL)
    elif OP == 3:
        r = tl.maximum(acc, v, propagate_nan=tl.PropagateNan.ALL)
    elif OP == 4:
        r = acc * v
    else:
        r = acc + v
    return r


@triton.jit
def finish(acc, OP: tl.constexpr, WORLD: tl.constexpr):
    """Apply avg's division by the world size."""
    if OP == 1:
        acc = acc / WORLD
    return acc


def signature(names_types: dict, dtype: torch.dtype, acc_dtype: torch.dtype | None = None) -> dict:
    """A compile signature: ``"T"`` stands for the data dtype, ``"A"`` for the accumulator's."""
    t = TL_NAME[dtype]
    a = TL_NAME[acc_dtype or dtype]
    return {k: v.replace("*T", "*" + t).replace("*A", "*" + a) for k, v in names_types.items()}


COMMON_SIG = {"pad": "*i64", "bases": "*i64", "rank": "i32", "err": "*i64",
              "timeout_ns": "i64", "epoch": "i64"}

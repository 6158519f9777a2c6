"""Argument checks of dispatch and combine, agreed between the ranks in one handshake.

Each rank describes its call (a list of ints: operation, mode, the first problem its own
arguments have and the token it concerns, E, H, K, dtype, fp8, max_tokens_per_rank, T, rows
per destination rank) and publishes it with :meth:`Communicator.exchange`. Every rank then
applies the same rules to the same descriptors, so all of them raise, and none waits for a
peer that gave up:

1. a rank whose own arguments are wrong raises its own ``TypeError``/``ValueError`` (naming the
   token for bad ``topk_idx`` rows); the others raise the same type naming that rank;
2. ranks that disagree on the operation, mode, K, H, dtype, fp8, max_tokens_per_rank or whether
   autograd records the call (its backward is collective too):
   :class:`~tilecomm.CommMismatch` on every rank, naming the field and every rank's value.

The handshake is also where every rank learns every other rank's row counts (the dispatch's
"count exchange") and that every peer has published its data (the CPU engine's only
synchronization per call).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..agree import compare
from ..errors import CommMismatch, CommTimeout

DTYPES = (torch.float32, torch.bfloat16, torch.float16)
OPS = ("dispatch", "combine")
MODES = ("normal", "low_latency", "grouped")

F_OP, F_MODE, F_PROBLEM, F_TOKEN, F_E, F_H, F_K, F_DTYPE, F_FP8, F_M, F_T, F_READY, \
    F_CALL, F_GRAD = range(14)
NFIELDS = 14          # then W values: rows to each rank (dispatch) / rows of y (combine)

#: problems a rank can find in its own arguments: id -> (exception type, text)
PROBLEMS = {
    1: (TypeError, "x, topk_idx and topk_weights must be torch.Tensors"),
    2: (ValueError, "x must be [T, hidden]"),
    3: (TypeError, "x has the wrong dtype"),
    4: (ValueError, "topk_idx must be [T, K] int64 with the rows of x"),
    5: (ValueError, "topk_weights must be float32 with the shape of topk_idx"),
    6: (ValueError, "bad topk_idx row"),
    7: (ValueError, "more tokens than max_tokens_per_rank"),
    8: (ValueError, "y has the wrong shape"),
    9: (TypeError, "y has the wrong dtype or device"),
    10: (ValueError, "combine was given the result of another dispatch"),
    11: (TypeError, "tensors are on different devices"),
    12: (ValueError, "max_tokens_per_rank must be a positive int"),
    13: (ValueError, "bad mode"),
    14: (ValueError, "gradients are not recorded in this mode"),
    15: (ValueError, "max_tokens_per_rank differs from the layer's"),
}


@dataclass
class Call:
    """The agreed call: every rank's descriptor plus the matrix of row counts."""
    op: str
    mode: str
    descs: list[list[int]]

    def counts(self) -> list[list[int]]:
        """``counts[s][r]``: rows rank ``s`` sends to rank ``r`` (dispatch) / the per-source
        values each rank published after the header (combine)."""
        return [d[NFIELDS:] for d in self.descs]

    def tokens(self) -> list[int]:
        return [d[F_T] for d in self.descs]

    def ready(self) -> bool:
        return all(d[F_READY] for d in self.descs)


def describe(op: str, mode: str, problem: int, token: int, *, e: int, h: int, k: int,
             dtype: torch.dtype, fp8: bool, m: int, t: int, ready: bool, call: int,
             per_rank: list[int], grad: bool = False) -> list[int]:
    d = [0] * NFIELDS
    d[F_OP], d[F_MODE], d[F_PROBLEM], d[F_TOKEN] = OPS.index(op), MODES.index(mode) \
        if mode in MODES else -1, problem, token
    d[F_E], d[F_H], d[F_K], d[F_DTYPE] = e, h, k, DTYPES.index(dtype) if dtype in DTYPES else -1
    d[F_FP8], d[F_M], d[F_T], d[F_READY], d[F_CALL] = int(fp8), m, t, int(ready), call
    d[F_GRAD] = int(grad)
    return d + [int(v) for v in per_rank]


def agree(comm, op: str, mine: list[int], detail: str = "") -> Call:
    """Exchange descriptors and apply the rules of the module docstring (collective)."""
    try:
        descs = comm.exchange(mine)
    except CommTimeout as e:        # name the operation, not the handshake's all_gather
        raise CommTimeout(f"moe {op}: {e}", collective=f"moe_{op}", seq=e.seq,
                          missing=e.missing) from e
    except CommMismatch as e:       # a different number of values: W differs, or another op
        raise CommMismatch(f"moe {op}: ranks made different calls ({e})") from e
    if mine[F_PROBLEM]:
        exc, text = PROBLEMS[mine[F_PROBLEM]]
        raise exc(f"moe {op}: {text}: {detail}" if detail else f"moe {op}: {text}")
    for r, d in enumerate(descs):
        if d[F_PROBLEM]:
            exc, text = PROBLEMS.get(d[F_PROBLEM], (ValueError, "bad arguments"))
            where = f" (token {d[F_TOKEN]})" if d[F_TOKEN] >= 0 else ""
            raise exc(f"moe {op}: rank {r} rejected its call: {text}{where}")
    fields = [(F_OP, "operation", lambda v: OPS[v]), (F_MODE, "mode", lambda v: MODES[v]),
              (F_E, "num_experts", int), (F_H, "hidden", int), (F_K, "K (topk columns)", int),
              (F_DTYPE, "dtype", lambda v: str(DTYPES[v]).removeprefix("torch.")),
              (F_FP8, "fp8", bool), (F_M, "max_tokens_per_rank", int),
              (F_CALL, "dispatch the combine belongs to", int),
              # autograd: a rank that records the op runs a collective backward, one that
              # does not would leave it waiting
              (F_GRAD, "recording gradients (an input requires grad)", bool)]
    compare(f"moe {op}", descs, fields)
    return Call(op, MODES[mine[F_MODE]], descs)

"""Argument checks of the fused ops, agreed between the ranks in one host handshake.

Every rank builds a descriptor of its call (op, engine, dtype, shapes, and the first problem
its own arguments have, if any) and publishes it with :meth:`Communicator.exchange`. Then every
rank applies the same rules to the same descriptors, so every rank raises, and none waits for a
peer that gave up:

1. a rank whose own arguments are wrong (not a 2-D tensor, unsupported dtype, inner dimensions
   that do not fit, a bad ``out``): that rank raises its own ``TypeError``/``ValueError``; the
   others raise the same type, naming the rank and the problem;
2. ranks that disagree (op, engine, dtype, the dimensions that must be equal):
   :class:`~tilecomm.CommMismatch` on every rank, naming the field and each rank's value;
3. shapes every rank has but that do not fit the group (``matmul_reduce_scatter``: rows of
   ``a`` not a multiple of the world size): ``ValueError`` naming the dimension, everywhere.

The handshake is also the point where every rank knows every other rank entered the call; the
CPU engine uses it as its only synchronization (see :mod:`tilecomm.ops.cpu`).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..agree import compare
from ..errors import CommTimeout

#: dtypes of the fused ops (float32 accumulation); index = the id exchanged
DTYPES = (torch.float32, torch.bfloat16, torch.float16)
OPS = ("all_gather_matmul", "matmul_reduce_scatter")
ENGINES = ("cpu", "kernel")
#: how all_gather_matmul's kernel engine moves the peers' chunks (``copy=``): the GEMM
#: kernel's own gets, or the copy engine on a side stream (:mod:`tilecomm.ops.kernel`)
COPIES = ("kernel", "stream")

# descriptor fields
F_OP, F_ENGINE, F_PROBLEM, F_DTYPE, F_A0, F_A1, F_B0, F_B1, F_FLAG, F_READY, F_COPY = range(11)
#: F_READY is not compared: whether the rank's engine published its data before the handshake
NFIELDS = 11

#: problems a rank can find in its own arguments: id -> (exception type, text)
PROBLEMS = {
    1: (TypeError, "a is not a torch.Tensor"),
    2: (TypeError, "b is not a torch.Tensor"),
    3: (ValueError, "a must be a 2-D tensor"),
    4: (ValueError, "b must be a 2-D tensor"),
    5: (TypeError, "dtype not supported (use float32, bfloat16 or float16)"),
    6: (TypeError, "a and b have different dtypes"),
    7: (TypeError, "a and b are on different devices"),
    8: (ValueError, "inner dimension K does not fit: a.shape[1] != b.shape[0]"),
    9: (ValueError, "out has the wrong shape"),
    10: (TypeError, "out has the wrong dtype or device"),
    11: (TypeError, "tensors are on a device without an engine (use cpu or cuda)"),
    12: (ValueError, "copy must be 'kernel' or 'stream'"),
}


@dataclass
class Call:
    """One rank's validated view of the call (same on every rank after :func:`agree`)."""
    op: str
    engine: str
    dtype: torch.dtype
    a: tuple[int, int]
    b: tuple[int, int]
    world: int
    #: every rank's descriptor
    descs: list[list[int]]

    @property
    def m(self) -> int:
        """Rows of a shard: all_gather_matmul's a_shard rows; matmul_reduce_scatter's output rows."""
        return self.a[0] if self.op == OPS[0] else self.a[0] // self.world

    @property
    def n(self) -> int:
        return self.b[1]


def local_problem(op: str, a, b, out, out_shape, device_ok, copy: str = "kernel"
                  ) -> tuple[int, str]:
    """The first problem of this rank's own arguments: ``(id, detail)`` or ``(0, "")``."""
    if copy not in COPIES:
        return 12, f"got {copy!r}"
    if not isinstance(a, torch.Tensor):
        return 1, f"got {type(a).__name__}"
    if not isinstance(b, torch.Tensor):
        return 2, f"got {type(b).__name__}"
    if a.dim() != 2:
        return 3, f"got shape {tuple(a.shape)}"
    if b.dim() != 2:
        return 4, f"got shape {tuple(b.shape)}"
    if a.dtype not in DTYPES:
        return 5, f"a is {a.dtype}"
    if b.dtype != a.dtype:
        return 6, f"a is {a.dtype}, b is {b.dtype}"
    if b.device != a.device:
        return 7, f"a on {a.device}, b on {b.device}"
    if not device_ok(a.device):
        return 11, f"a on {a.device}"
    if a.shape[1] != b.shape[0]:
        what = "a_shard" if op == OPS[0] else "a"
        return 8, f"{what} is {tuple(a.shape)}, b is {tuple(b.shape)}"
    if out is not None:
        if not isinstance(out, torch.Tensor) or out_shape(a, b) is None \
                or tuple(out.shape) != out_shape(a, b):
            got = tuple(out.shape) if isinstance(out, torch.Tensor) else type(out).__name__
            return 9, f"expected {out_shape(a, b)}, got {got}"
        if out.dtype != a.dtype or out.device != a.device:
            return 10, f"expected {a.dtype} on {a.device}, got {out.dtype} on {out.device}"
    return 0, ""


def describe(op: str, engine: str, a, b, problem: int, flag: int, ready: bool = False,
             copy: str = "kernel") -> list[int]:
    d = [0] * NFIELDS
    d[F_READY] = int(ready)
    d[F_COPY] = COPIES.index(copy) if copy in COPIES else -1
    d[F_OP], d[F_ENGINE], d[F_PROBLEM], d[F_FLAG] = OPS.index(op), ENGINES.index(engine), \
        problem, int(flag)
    ok = problem == 0 or 4 < problem < 12
    d[F_DTYPE] = DTYPES.index(a.dtype) if ok and problem != 5 else -1
    if ok:
        d[F_A0], d[F_A1] = a.shape
        d[F_B0], d[F_B1] = b.shape
    return d


def agree(comm, op: str, engine: str, a, b, *, out=None, out_shape=None, device_ok=None,
          flag: int = 0, ready: bool = False, copy: str = "kernel") -> Call:
    """Exchange descriptors and apply the rules of the module docstring (collective)."""
    problem, detail = local_problem(op, a, b, out, out_shape or (lambda *_: None),
                                    device_ok or (lambda d: True), copy)
    mine = describe(op, engine, a, b, problem, flag, ready, copy)
    try:
        descs = comm.exchange(mine)
    except CommTimeout as e:        # name the op, not the handshake's all_gather
        raise CommTimeout(f"{op}: {e}", collective=op, seq=e.seq, missing=e.missing) from e
    me, world = comm.rank, comm.world_size
    # 1. a rank with bad arguments of its own
    if problem:
        exc, text = PROBLEMS[problem]
        raise exc(f"{op}: {text} ({detail})")
    for r, d in enumerate(descs):
        if d[F_PROBLEM]:
            exc, text = PROBLEMS.get(d[F_PROBLEM], (ValueError, "bad arguments"))
            raise exc(f"{op}: rank {r} rejected its call: {text}")
    # 2. disagreements
    fields = [(F_OP, "op", lambda v: OPS[v]), (F_ENGINE, "engine", lambda v: ENGINES[v]),
              (F_DTYPE, "dtype", lambda v: str(DTYPES[v]).removeprefix("torch.")),
              (F_FLAG, "return_gathered", bool)]
    if op == OPS[0]:     # all_gather_matmul: every shard has the same shape, b the same N
        fields += [(F_A0, "m (rows of a_shard)", int), (F_A1, "K", int), (F_B1, "N", int),
                   (F_COPY, "copy", lambda v: COPIES[v])]
    else:                # matmul_reduce_scatter: K_r may differ per rank (uneven slices)
        fields += [(F_A0, "M (rows of a)", int), (F_B1, "N", int)]
    compare(op, descs, fields)
    # 3. shapes that do not fit the group
    if op == OPS[1] and descs[me][F_A0] % world:
        raise ValueError(f"{op}: dim 0 of a (M={descs[me][F_A0]}) must be a multiple of "
                         f"world_size ({world}): each rank keeps M / world_size rows")
    d = descs[me]
    return Call(op, engine, DTYPES[d[F_DTYPE]], (d[F_A0], d[F_A1]), (d[F_B0], d[F_B1]),
                world, descs)

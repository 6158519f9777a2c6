"""``algo="engine"``: a call across hosts delegated to torch.distributed over all ranks.

NOTE [the engine as a candidate]
    A communicator whose ranks span hosts keeps a torch.distributed group over all its ranks
    (``Rails.world``: Gloo for CPU tensors, NCCL for CUDA tensors). ``engine`` runs a call
    there as one flat collective, so that ``auto`` can take it where it beats the hierarchical
    algorithms (NOTE [auto by predicted cost]). It keeps every other algorithm's promises:

    * **Descriptor first.** The call's descriptor (collective, algorithm, dtype, count, op,
      root, row shape, sequence number) is the fixed-size header block of ``Rails.header``,
      all-gathered over the world group (``Rails.header_round``) before any message whose size
      depends on the call: ranks that disagree raise ``CommMismatch`` on every rank, and
      nothing lands in a buffer of the wrong size.
    * **Small calls are that round.** When every rank's contribution fits the block's
      payload (``SMALL`` bytes, CPU tensors), it travels inside the header: each rank then
      takes what it needs from the blocks and reduces in rank order. One exchange in all,
      the same message count as Gloo's own smallest collectives.
    * **Larger calls** then run the group's own collective (allreduce, allgather,
      reduce_scatter, broadcast, reduce, alltoall). AVG is a SUM divided by the world size
      afterwards (Gloo has no AVG).
    * A failure or timeout is ``CommTimeout`` naming the call, its sequence number and the
      peers (``Rails.wait``); a stop by another rank is the stop.

    Not rank-ordered for large reductions (Gloo's ring), so deterministic mode never offers
    it; all_to_all_v is not offered (its row counts would cost a round of their own).
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from ..backends.base import CollectiveCall
from ..types import OP_ID, ReduceOp
from .rails import HDR_BYTES, SMALL

#: collectives the engine runs
COLLECTIVES = ("all_reduce", "all_gather", "reduce_scatter", "broadcast", "reduce",
               "all_to_all")
_OPS = {ReduceOp.SUM: dist.ReduceOp.SUM, ReduceOp.AVG: dist.ReduceOp.SUM,
        ReduceOp.PROD: dist.ReduceOp.PRODUCT, ReduceOp.MIN: dist.ReduceOp.MIN,
        ReduceOp.MAX: dist.ReduceOp.MAX}


def supports(collective: str, dtype: torch.dtype, device: str = "cpu") -> bool:
    """Whether ``engine`` runs ``collective`` on ``dtype`` tensors (float8 and complex: no)."""
    if collective not in COLLECTIVES:
        return False
    return dtype.is_floating_point and dtype.itemsize >= 2 or dtype in (
        torch.int8, torch.uint8, torch.int32, torch.int64)


def run(be, call: CollectiveCall, seq: int) -> None:
    """One call of ``engine`` on this rank (``be``: the HierBackend)."""
    bufs = call.buffers
    first = next(iter(bufs.values()), None)
    device = first.device.type if first is not None else "cpu"
    rails = be.rails_for(device)
    cpu_rails = be.rails_for("cpu")
    w, me, what = be.world_size, be.rank, call.collective
    mine = _contribution(call, me)
    inline = device == "cpu" and mine is not None and mine.numel() * mine.element_size() <= SMALL
    nbytes = mine.numel() * mine.element_size() if inline else 0
    hdr = cpu_rails.header(seq, what, "engine", call.dtype.id if call.dtype else 0, call.count,
                           OP_ID.get(call.op, 0), call.root, nbytes, rows=call.row_shape)
    if nbytes:
        hdr[HDR_BYTES:HDR_BYTES + nbytes] = mine.reshape(-1).view(torch.uint8)
    blocks = cpu_rails.header_round(cpu_rails.world, range(w), hdr, what, seq,
                                    rows=call.row_shape)
    if inline:
        payloads = [b[HDR_BYTES:HDR_BYTES + nbytes].view(mine.dtype) for b in blocks]
        _finish_small(call, me, w, payloads)
        return
    _collective(rails, call, me, w, seq)


def _contribution(call: CollectiveCall, me: int) -> torch.Tensor | None:
    """What this rank puts in the header for the small path (None: nothing to send)."""
    b = call.buffers
    if call.collective in ("all_reduce", "reduce"):
        return b["buf"]
    if call.collective == "broadcast":
        return b["buf"]         # every rank sends one: the size check is the same on each
    if call.collective in ("all_gather", "reduce_scatter", "all_to_all"):
        return b["in"]
    return None


def _finish_small(call: CollectiveCall, me: int, w: int, vals: list[torch.Tensor]) -> None:
    from .backend import reduce_into
    b, c = call.buffers, call.collective
    if c == "all_reduce" or (c == "reduce" and me == call.root):
        reduce_into(b["buf"], vals, call.op, w)
    elif c == "broadcast":
        if me != call.root:
            b["buf"].copy_(vals[call.root])
    elif c == "all_gather":
        n = vals[0].numel()
        for r, v in enumerate(vals):
            b["out"][r * n:(r + 1) * n] = v
    elif c == "reduce_scatter":
        n = b["out"].numel()
        reduce_into(b["out"], [v[me * n:(me + 1) * n] for v in vals], call.op, w)
    elif c == "all_to_all":
        n = b["out"].numel() // w
        for r, v in enumerate(vals):
            b["out"][r * n:(r + 1) * n] = v[me * n:(me + 1) * n]


def _collective(rails, call: CollectiveCall, me: int, w: int, seq: int) -> None:
    b, c, pg, what = call.buffers, call.collective, rails.world, call.collective
    op = call.op or ReduceOp.SUM
    if c == "all_reduce":
        opts = dist.AllreduceOptions()
        opts.reduceOp = _OPS[op]
        work = pg.allreduce([b["buf"]], opts)
    elif c == "reduce":
        opts = dist.ReduceOptions()
        opts.reduceOp, opts.rootRank = _OPS[op], call.root
        # Gloo works in the non-roots' buffers, which the call must leave as they were
        work = pg.reduce([b["buf"] if me == call.root else b["buf"].clone()], opts)
    elif c == "broadcast":
        opts = dist.BroadcastOptions()
        opts.rootRank = call.root
        work = pg.broadcast([b["buf"]], opts)
    elif c == "all_gather":     # the group is not registered with torch.distributed, so its
        # own flat ops, not dist.all_gather_into_tensor (tests/test_layering.py allows them)
        work = pg._allgather_base(b["out"], b["in"])
    elif c == "reduce_scatter":
        opts = dist.ReduceScatterOptions()
        opts.reduceOp = _OPS[op]
        work = pg._reduce_scatter_base(b["out"], b["in"], opts)
    elif c == "all_to_all":
        work = pg.alltoall_base(b["out"], b["in"], [], [], dist.AllToAllOptions())
    else:
        raise ValueError(f"engine does not run {c}")
    rails.wait(work, what, seq, range(w))
    if op is ReduceOp.AVG and (c != "reduce" or me == call.root):
        (b["out"] if c == "reduce_scatter" else b["buf"]).div_(w)

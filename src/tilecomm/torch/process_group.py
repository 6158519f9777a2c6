"""``ProcessGroupTilecomm``: torch.distributed's process-group interface on a tilecomm Communicator.

torch.distributed calls these methods with lists of tensors and an options object; each one
checks its arguments (an error names the collective and the reason, and reaches the peers, which
raise too instead of waiting), flattens the tensors into what the Communicator moves (see
``tensors.py``) and runs one Communicator collective. Collectives finish inside the call, so
their work objects are born complete; send and recv run on per-peer threads (``p2p.py``).

Every group (the world and each ``new_group``) has its own Communicator, rendezvoused through
the store torch gives the group, with the group's timeout bounding every wait.
"""

from __future__ import annotations

import concurrent.futures.thread  # noqa: F401 - its exit hook must be registered before ours
import itertools
import threading
import weakref
from datetime import timedelta

import torch
import torch.distributed as dist

from ..errors import CommError, CommMismatch
from ..launch import connect
from .p2p import PeerTransfers
from .tensors import Flat, check_tensor, known_plan, reduce_parts, reduce_plan
from .work import DoneWork

BACKEND_NAME = "tilecomm"
_group_ids = itertools.count()
_live_groups: "weakref.WeakSet[ProcessGroupTilecomm]" = weakref.WeakSet()


def _cancel_at_exit() -> None:
    """At interpreter exit, before Python joins worker threads: end the waits of send/recv
    threads of groups never destroyed (a send nobody receives would hold the exit until the
    peer exits or the group's timeout)."""
    for pg in list(_live_groups):
        if not pg.comm.closed:
            pg._p2p.closing = True
            pg.comm.host.cancel_waits("the interpreter is exiting")


# threading's exit hooks run in reverse order of registration, before threads are joined
# (concurrent.futures joins its workers from one registered above, at its import).
if hasattr(threading, "_register_atexit"):
    threading._register_atexit(_cancel_at_exit)


class ProcessGroupTilecomm(dist.ProcessGroup):
    """A torch.distributed process group whose collectives run on tilecomm (CPU tensors)."""

    def __init__(self, store, rank: int, world_size: int, timeout: timedelta, comm=None):
        """``comm``: the Communicator to serve (a shrunk one); by default one is connected
        through ``store``."""
        super().__init__(rank, world_size)
        seconds = timeout.total_seconds() if timeout is not None else None
        self.comm = comm if comm is not None else connect(store, rank, world_size,
                                                          timeout=seconds)
        self.timeout = self.comm.timeout
        self._p2p = PeerTransfers(self.comm, f"tilecomm-pg{next(_group_ids)}")
        _live_groups.add(self)

    # ---- identity ------------------------------------------------------------------------
    def getBackendName(self) -> str:  # noqa: N802 - name fixed by torch
        return BACKEND_NAME

    @property
    def _backend_name(self) -> str:
        return BACKEND_NAME

    # torch names a group through its C++ backends, and this group has none: keep the name
    # (and description) here, where destroy_process_group and friends look them up.
    def _set_group_name(self, name: str) -> None:
        self._tilecomm_name = name

    @property
    def group_name(self) -> str:
        name = getattr(self, "_tilecomm_name", None)
        if name is None:
            raise RuntimeError("tilecomm backend: the process group has no name yet")
        return name

    def _set_group_desc(self, desc: str) -> None:
        self._tilecomm_desc = desc

    @property
    def group_desc(self) -> str:
        return getattr(self, "_tilecomm_desc", "undefined")

    def __repr__(self) -> str:
        return f"ProcessGroupTilecomm(rank={self.rank()}, size={self.size()})"

    def shutdown(self) -> None:
        """Stop the send/recv threads and unmap the heap (idempotent).

        A send or recv still waiting for its peer ends with a CommError (within ~0.2 s)
        instead of holding destroy_process_group until the peer exits or the timeout.
        """
        self._p2p.closing = True
        if not self.comm.closed:
            self.comm.host.cancel_waits("the process group was destroyed")
        self._p2p.shutdown()
        self.comm.close()

    # ---- failures: abort and shrink (dist.shrink_group) ---------------------------------
    def abort(self) -> None:
        """torch's abort path (``_abort_process_group``): stop the group's communicator on
        every rank (``Communicator.abort``); in-flight calls end with CommAborted."""
        self._p2p.closing = True
        if not self.comm.closed:
            self.comm.abort("the process group was aborted (torch.distributed abort path)")

    @property
    def supports_shrinking(self) -> bool:
        return True

    def _get_backend(self, device):
        """This group is its own CPU backend (``dist.shrink_group`` looks the backend up by
        device; torch expects a RuntimeError for a device it does not serve)."""
        if torch.device(device).type == "cpu":
            return self
        raise RuntimeError(f"tilecomm backend: no backend for {device} tensors in this group")

    def shrink(self, ranks_to_exclude, shrink_flags: int = 0, opts_override=None):
        """``dist.shrink_group``'s call: a new group over the ranks not excluded (group
        ranks, renumbered in order), on ``Communicator.shrink``; ``shrink_flags`` with
        SHRINK_ABORT (1) first aborts what is in flight. torch then destroys this group."""
        new = self.comm.shrink(list(ranks_to_exclude), abort=bool(int(shrink_flags) & 1))
        return ProcessGroupTilecomm(None, new.rank, new.world_size,
                                    timedelta(seconds=new.timeout), comm=new)

    # ---- helpers -------------------------------------------------------------------------
    def _single(self, tensors, collective: str) -> torch.Tensor:
        if len(tensors) != 1:
            raise ValueError(f"tilecomm backend: {collective} takes one tensor per call, got "
                             f"{len(tensors)}")
        return check_tensor(tensors[0], collective)

    def _reduce_into(self, t: torch.Tensor, opts_op, collective: str, root: int | None) -> None:
        """all_reduce (``root`` None) or reduce of ``t`` in place."""
        comm = self.comm
        with comm.host.refusing(collective):
            kind, how, view = reduce_plan(t, opts_op, collective)
        if kind == "native":
            x = view(t) if view is not None else t
            if root is None:
                comm.all_reduce(x, how)
            else:
                comm.reduce(x, root, how)
            return
        # Reference path: every rank gathers every rank's bytes and folds them in rank order.
        src = Flat(t, write=False, as_bytes=True)
        allb = comm.all_gather(src.x)
        parts = [p.view(t.dtype) for p in allb.chunk(self.size())]
        if root is None or root == self.rank():
            try:    # every rank holds the same parts, so every rank raises alike
                result = reduce_parts(parts, how)
            except (RuntimeError, TypeError, NotImplementedError) as e:
                raise TypeError(f"tilecomm backend: {collective}: cannot reduce {t.dtype} "
                                f"tensors with {getattr(opts_op, 'op', opts_op)}: {e}") from e
            with torch.no_grad():
                t.copy_(result.view(t.shape))

    def _exchange_bytes(self, collective: str, sends: list[torch.Tensor | None],
                        recvs: list[torch.Tensor | None]) -> None:
        """Move ``sends[j]`` to rank ``j`` and fill ``recvs[j]`` from rank ``j`` (None: nothing),
        in one all_to_all_v over bytes: the general form behind gather, scatter and lists."""
        comm = self.comm
        with comm.host.refusing(collective):
            ins = [Flat(s, write=False, as_bytes=True) if s is not None else None for s in sends]
            outs = [Flat(r, read=False, as_bytes=True) if r is not None else None for r in recvs]
            send_counts = [x.x.numel() if x is not None else 0 for x in ins]
            recv_counts = [x.x.numel() if x is not None else 0 for x in outs]
            parts = [x.x for x in ins if x is not None]
            data = torch.cat(parts) if parts else torch.empty(0, dtype=torch.uint8)
        try:
            got = comm.all_to_all_v(data, send_counts, recv_counts)
        except CommMismatch as e:   # every rank raises it: say which torch call it was
            raise CommMismatch(f"tilecomm backend: {collective}: the ranks' tensor sizes do "
                               f"not match (moved as all_to_all_v over bytes): {e}") from e
        off = 0
        for x, n in zip(outs, recv_counts):
            if x is not None:
                x.x.copy_(got[off:off + n])
                x.finish()
            off += n

    # ---- collectives ---------------------------------------------------------------------
    def allreduce(self, tensors, opts=None):
        op = opts.reduceOp if opts is not None else dist.ReduceOp.SUM
        if len(tensors) == 1:
            # the common repeated call: one dense CPU tensor whose (dtype, op) was decided
            # before. None of the checks below can fail for it, so skip their bookkeeping
            # (what the torch layer still costs per call, about 5.4 us over the Communicator
            # at small sizes, is in docs/benchmarks.md, "torch.distributed backend")
            t = tensors[0]
            plan = known_plan(t, op) if type(t) is torch.Tensor else None
            if (plan is not None and plan[0] == "native" and plan[2] is None and t.is_cpu
                    and t.layout == torch.strided):
                self.comm.all_reduce(t, plan[1])
                return DoneWork(list(tensors))
        if tensors and all(isinstance(t, torch.Tensor) and t.layout == torch.sparse_coo
                           for t in tensors):
            for t in tensors:
                self._sparse_all_reduce(t, op)
            return DoneWork(list(tensors))
        with self.comm.host.refusing("all_reduce"):
            for t in tensors:
                check_tensor(t, "all_reduce")
        for t in tensors:
            self._reduce_into(t, op, "all_reduce", None)
        return DoneWork(list(tensors))

    def _sparse_all_reduce(self, t: torch.Tensor, op) -> None:
        """Sum of sparse COO tensors: every rank gathers every rank's (indices, values) and
        adds them in rank order, so all ranks hold the same coalesced result."""
        w = self.size()
        with self.comm.host.refusing("all_reduce"):
            if getattr(op, "op", op) != dist.ReduceOp.SUM:
                raise ValueError(f"tilecomm backend: all_reduce: sparse tensors support SUM "
                                 f"only, got {getattr(op, 'op', op)}")
            check_tensor(t.coalesce().values(), "all_reduce", "sparse values")
            s = t.coalesce()
            idx, vals = s.indices().contiguous(), s.values().contiguous()
        nnz = self.comm.all_gather(torch.tensor([idx.shape[1]], dtype=torch.int64)).tolist()
        idxs = [torch.empty((idx.shape[0], n), dtype=idx.dtype) for n in nnz]
        valss = [torch.empty((n, *vals.shape[1:]), dtype=vals.dtype) for n in nnz]
        self._exchange_bytes("all_reduce", [idx] * w, idxs)
        self._exchange_bytes("all_reduce", [vals] * w, valss)
        total = torch.sparse_coo_tensor(idxs[0], valss[0], t.shape)
        for i, v in zip(idxs[1:], valss[1:]):
            total = total + torch.sparse_coo_tensor(i, v, t.shape)
        with torch.no_grad():
            t.copy_(total.coalesce())

    def allreduce_coalesced(self, tensors, opts=None):
        op = opts.reduceOp if opts is not None else dist.ReduceOp.SUM
        with self.comm.host.refusing("all_reduce_coalesced"):
            for t in tensors:
                check_tensor(t, "all_reduce_coalesced")
        dtypes = {t.dtype for t in tensors}
        if len(dtypes) == 1 and all(t.is_contiguous() for t in tensors) and len(tensors) > 1:
            # One call for the whole list: flatten, reduce, split back.
            flat = torch.cat([t.reshape(-1) for t in tensors])
            self._reduce_into(flat, op, "all_reduce_coalesced", None)
            off = 0
            with torch.no_grad():
                for t in tensors:
                    t.copy_(flat[off:off + t.numel()].view(t.shape))
                    off += t.numel()
        else:
            for t in tensors:
                self._reduce_into(t, op, "all_reduce_coalesced", None)
        return DoneWork(list(tensors))

    def reduce(self, tensors, opts=None):
        with self.comm.host.refusing("reduce"):
            t = self._single(tensors, "reduce")
        root = opts.rootRank if opts is not None else 0
        op = opts.reduceOp if opts is not None else dist.ReduceOp.SUM
        self._reduce_into(t, op, "reduce", root)
        return DoneWork([t])

    def broadcast(self, tensors, opts=None):
        root = opts.rootRank if opts is not None else 0
        with self.comm.host.refusing("broadcast"):
            for t in tensors:
                check_tensor(t, "broadcast")
        for t in tensors:
            f = Flat(t)
            self.comm.broadcast(f.x, root)
            f.finish()
        return DoneWork(list(tensors))

    def allgather(self, output_tensors, input_tensors, opts=None):
        w = self.size()
        for outs, inp in zip(output_tensors, input_tensors):
            with self.comm.host.refusing("all_gather"):
                check_tensor(inp, "all_gather", "input")
                if len(outs) != w:
                    raise ValueError(f"tilecomm backend: all_gather: output list has {len(outs)} "
                                     f"tensors; the group has {w} ranks")
                for o in outs:
                    check_tensor(o, "all_gather", "output")
                    if o.dtype != inp.dtype:
                        raise TypeError(f"tilecomm backend: all_gather: output dtype {o.dtype} "
                                        f"differs from input dtype {inp.dtype}")
            if all(o.numel() == inp.numel() for o in outs):
                src = Flat(inp, write=False)
                got = self.comm.all_gather(src.x)
                m = src.x.numel()
                with torch.no_grad():
                    for j, o in enumerate(outs):
                        o.copy_(got[j * m:(j + 1) * m].view(o.dtype).view(o.shape))
            else:   # uneven sizes: every rank sends its whole input to every rank
                self._exchange_bytes("all_gather", [inp] * w, list(outs))
        return DoneWork([o for outs in output_tensors for o in outs])

    def all_gather_single(self, output, input, opts=None):  # noqa: A002 - torch's names
        w = self.size()
        with self.comm.host.refusing("all_gather_into_tensor"):
            check_tensor(input, "all_gather_into_tensor", "input")
            check_tensor(output, "all_gather_into_tensor", "output")
            if output.numel() != w * input.numel() or output.dtype != input.dtype:
                raise ValueError(f"tilecomm backend: all_gather_into_tensor: output must hold "
                                 f"{w} x {input.numel()} {input.dtype} elements, got "
                                 f"{output.numel()} {output.dtype}")
            src, dst = Flat(input, write=False), Flat(output, read=False)
        self.comm.all_gather(src.x, out=dst.x)
        dst.finish()
        return DoneWork([output])

    def allgather_into_tensor_coalesced(self, outputs, inputs, opts=None):
        for o, i in zip(outputs, inputs):
            self.all_gather_single(o, i, opts)
        return DoneWork(list(outputs))

    def all_gather_single_coalesced(self, outputs, inputs, opts=None):
        return self.allgather_into_tensor_coalesced(outputs, inputs, opts)

    def allgather_coalesced(self, output_lists, input_list, opts=None):
        w = self.size()
        with self.comm.host.refusing("all_gather_coalesced"):
            for t in input_list:
                check_tensor(t, "all_gather_coalesced", "input")
            if len(output_lists) != w or any(len(o) != len(input_list) for o in output_lists):
                raise ValueError(f"tilecomm backend: all_gather_coalesced: need {w} output lists "
                                 f"of {len(input_list)} tensors each")
        for i, inp in enumerate(input_list):
            self.allgather([[output_lists[r][i] for r in range(w)]], [inp])
        return DoneWork([t for lst in output_lists for t in lst])

    def reduce_scatter(self, output_tensors, input_tensors, opts=None):
        w, me = self.size(), self.rank()
        op = opts.reduceOp if opts is not None else dist.ReduceOp.SUM
        for out, ins in zip(output_tensors, input_tensors):
            with self.comm.host.refusing("reduce_scatter"):
                check_tensor(out, "reduce_scatter", "output")
                if len(ins) != w:
                    raise ValueError(f"tilecomm backend: reduce_scatter: input list has "
                                     f"{len(ins)} tensors; the group has {w} ranks")
                for x in ins:
                    check_tensor(x, "reduce_scatter", "input")
                    if x.dtype != out.dtype:
                        raise TypeError(f"tilecomm backend: reduce_scatter: input dtype "
                                        f"{x.dtype} differs from output dtype {out.dtype}")
                if ins[me].numel() != out.numel():
                    raise ValueError(f"tilecomm backend: reduce_scatter: output has "
                                     f"{out.numel()} elements but this rank's input has "
                                     f"{ins[me].numel()}")
            flat = torch.cat([x.reshape(-1) for x in ins])
            if all(x.numel() == out.numel() for x in ins):
                self._reduce_scatter_flat(out, flat, op, "reduce_scatter")
            else:   # uneven: reduce everything, keep this rank's part
                self._reduce_into(flat, op, "reduce_scatter", None)
                off = sum(x.numel() for x in ins[:me])
                with torch.no_grad():
                    out.copy_(flat[off:off + out.numel()].view(out.shape))
        return DoneWork(list(output_tensors))

    def _reduce_scatter_flat(self, out, flat, op, collective: str) -> None:
        comm = self.comm
        with comm.host.refusing(collective):
            kind, how, view = reduce_plan(flat, op, collective)
        if kind == "native":
            tmp = out if out.is_contiguous() else torch.empty_like(
                out, memory_format=torch.contiguous_format)
            x = tmp.reshape(-1)
            if view is not None:    # complex: reduce the (real, imag) float pairs
                flat, x = view(flat).reshape(-1), view(x).reshape(-1)
            comm.reduce_scatter(flat, how, out=x)
            if tmp is not out:
                with torch.no_grad():
                    out.copy_(tmp)
            return
        self._reduce_into(flat, op, collective, None)
        n = out.numel()
        with torch.no_grad():
            out.copy_(flat[self.rank() * n:(self.rank() + 1) * n].view(out.shape))

    def reduce_scatter_single(self, output, input, opts=None):  # noqa: A002 - torch's names
        op = opts.reduceOp if opts is not None else dist.ReduceOp.SUM
        with self.comm.host.refusing("reduce_scatter_tensor"):
            check_tensor(input, "reduce_scatter_tensor", "input")
            check_tensor(output, "reduce_scatter_tensor", "output")
            if input.numel() != self.size() * output.numel() or input.dtype != output.dtype:
                raise ValueError(f"tilecomm backend: reduce_scatter_tensor: input must hold "
                                 f"{self.size()} x {output.numel()} {output.dtype} elements, got "
                                 f"{input.numel()} {input.dtype}")
        self._reduce_scatter_flat(output, input.reshape(-1), op, "reduce_scatter_tensor")
        return DoneWork([output])

    def reduce_scatter_tensor_coalesced(self, outputs, inputs, opts=None):
        for o, i in zip(outputs, inputs):
            self.reduce_scatter_single(o, i, opts)
        return DoneWork(list(outputs))

    def reduce_scatter_single_coalesced(self, outputs, inputs, opts=None):
        return self.reduce_scatter_tensor_coalesced(outputs, inputs, opts)

    def all_to_all_single(self, output, input, output_split_sizes,  # noqa: A002
                          input_split_sizes, opts=None):
        w = self.size()
        comm = self.comm
        with comm.host.refusing("all_to_all_single"):
            check_tensor(input, "all_to_all_single", "input")
            check_tensor(output, "all_to_all_single", "output")
            if output.dtype != input.dtype:
                raise TypeError(f"tilecomm backend: all_to_all_single: output dtype "
                                f"{output.dtype} differs from input dtype {input.dtype}")
            rows_in = input.shape[0] if input.dim() else 1
            rows_out = output.shape[0] if output.dim() else 1
            # Elements per row from the shape (not numel // rows: an empty input still
            # receives rows, and its peers' rows have the output's row size).
            row = _row_numel(input if input.dim() else output)
            if output.dim() and _row_numel(output) != row:
                raise ValueError(f"tilecomm backend: all_to_all_single: input rows hold {row} "
                                 f"elements, output rows {_row_numel(output)}")
            send = list(input_split_sizes) or _even(rows_in, w, "input", "all_to_all_single")
            recv = list(output_split_sizes) or _even(rows_out, w, "output", "all_to_all_single")
            if len(send) != w or len(recv) != w:
                raise ValueError(f"tilecomm backend: all_to_all_single: split sizes need {w} "
                                 f"entries, got {len(send)} (input) and {len(recv)} (output)")
            if sum(send) != rows_in or sum(recv) != rows_out:
                raise ValueError(f"tilecomm backend: all_to_all_single: splits sum to "
                                 f"{sum(send)}/{sum(recv)} rows but the tensors have "
                                 f"{rows_in}/{rows_out}")
            src, dst = Flat(input, write=False), Flat(output, read=False)
            scale = src.x.element_size() and input.element_size() // src.x.element_size()
        unit = row * scale
        comm.all_to_all_v(src.x, [s * unit for s in send], [r * unit for r in recv], out=dst.x)
        dst.finish()
        return DoneWork([output])

    def alltoall(self, output_tensors, input_tensors, opts=None):
        w = self.size()
        with self.comm.host.refusing("all_to_all"):
            if len(output_tensors) != w or len(input_tensors) != w:
                raise ValueError(f"tilecomm backend: all_to_all: need {w} input and {w} output "
                                 f"tensors, got {len(input_tensors)} and {len(output_tensors)}")
            for t in [*output_tensors, *input_tensors]:
                check_tensor(t, "all_to_all")
        self._exchange_bytes("all_to_all", list(input_tensors), list(output_tensors))
        return DoneWork(list(output_tensors))

    def gather(self, output_tensors, input_tensors, opts=None):
        w, me = self.size(), self.rank()
        root = opts.rootRank if opts is not None else 0
        with self.comm.host.refusing("gather"):
            inp = self._single(input_tensors, "gather")
            outs = output_tensors[0] if output_tensors else []
            if me == root and len(outs) != w:
                raise ValueError(f"tilecomm backend: gather: the root needs a list of {w} "
                                 f"output tensors, got {len(outs)}")
            for o in outs:
                check_tensor(o, "gather", "output")
        sends = [inp if j == root else None for j in range(w)]
        recvs = list(outs) if me == root else [None] * w
        self._exchange_bytes("gather", sends, recvs)
        return DoneWork(list(outs))

    def scatter(self, output_tensors, input_tensors, opts=None):
        w, me = self.size(), self.rank()
        root = opts.rootRank if opts is not None else 0
        with self.comm.host.refusing("scatter"):
            out = self._single(output_tensors, "scatter")
            ins = input_tensors[0] if input_tensors else []
            if me == root and len(ins) != w:
                raise ValueError(f"tilecomm backend: scatter: the root needs a list of {w} "
                                 f"input tensors, got {len(ins)}")
            for i in ins:
                check_tensor(i, "scatter", "input")
        sends = list(ins) if me == root else [None] * w
        recvs = [out if j == root else None for j in range(w)]
        self._exchange_bytes("scatter", sends, recvs)
        return DoneWork([out])

    def barrier(self, opts=None):
        self.comm.barrier()
        return DoneWork([])

    # ---- point-to-point (p2p.py) ---------------------------------------------------------
    def send(self, tensors, dst: int, tag: int = 0):
        return self._p2p.send(self._single(tensors, "send"), dst, tag)

    def recv(self, tensors, src: int, tag: int = 0):
        return self._p2p.recv(self._single(tensors, "recv"), src, tag)

    def recv_anysource(self, tensors, tag: int = 0):
        return self._p2p.recv_any(self._single(tensors, "recv"), tag)


# Names older torch releases call (before the *_single spellings).
ProcessGroupTilecomm._allgather_base = ProcessGroupTilecomm.all_gather_single
ProcessGroupTilecomm._reduce_scatter_base = ProcessGroupTilecomm.reduce_scatter_single
ProcessGroupTilecomm.alltoall_base = ProcessGroupTilecomm.all_to_all_single


def _row_numel(t: torch.Tensor) -> int:
    n = 1
    for s in t.shape[1:]:
        n *= s
    return n


def _even(rows: int, w: int, what: str, collective: str) -> list[int]:
    if rows % w:
        raise ValueError(f"tilecomm backend: {collective}: {what} dim 0 ({rows}) is not a "
                         f"multiple of the group size {w}; pass split sizes")
    return [rows // w] * w


def create_process_group(store, rank: int, world_size: int, timeout: timedelta):
    """The factory registered with ``dist.Backend.register_backend``."""
    try:
        return ProcessGroupTilecomm(store, rank, world_size, timeout)
    except CommError:
        raise
    except OSError as e:
        raise CommError(f"tilecomm backend: could not create the shared-memory heap: {e}") from e

"""HierBackend: runs hierarchical plans (``plans.py``) for a communicator whose ranks span hosts.

The Communicator hands it flat tensors and a resolved algorithm, as to any backend. Local steps
run on the host's own tilecomm communicator (``local``: shared memory on CPU, the Triton
kernels over CUDA IPC for CUDA tensors); rail and exchange steps run on torch.distributed
groups (``Rails``: Gloo for CPU tensors, NCCL for CUDA tensors, queued on the current stream
so the two legs stay stream-ordered).

Errors: a rank that fails in a local step still joins its next rail header round with an
error header (so the other hosts raise at once, with the cause), then raises; a rank that
fails in a rail step rejects its next local step (so host peers that were not on that rail
raise too), then raises.
"""

from __future__ import annotations

import numpy as np
import torch

from ..backends.base import Backend, CollectiveCall, check_split_sizes
from ..errors import CommAborted, CommError, CommRevoked, CommTimeout
from ..types import OP_ID, DType, ReduceOp, lookup_dtype
from ..tuning.costs import ENGINE
from . import engine
from .layout import HostLayout
from .plans import Copy, Exchange, HierPlan, Local, Rail, Region, hier_algorithms, hier_plan
from .rails import HDR_BYTES, SMALL, Rails

_WIDE = {torch.float16: torch.float32, torch.bfloat16: torch.float32}
_FN = {ReduceOp.SUM: torch.add, ReduceOp.AVG: torch.add, ReduceOp.PROD: torch.mul,
       ReduceOp.MIN: torch.minimum, ReduceOp.MAX: torch.maximum}


def algorithms_across_hosts(collective: str, layout: HostLayout) -> list[str]:
    """What runs ``collective`` on ranks that span hosts: the hierarchical algorithms of
    ``layout``, then ``engine`` (NOTE [the engine as a candidate] in ``engine.py``) where it
    runs ``collective``."""
    extra = [ENGINE] if collective in engine.COLLECTIVES else []
    return hier_algorithms(collective, layout) + extra


class HierBackend(Backend):
    """Collectives over ranks on several hosts; see the module docstring."""

    tensor_buffers = True
    kind = "hier"

    def __init__(self, local, layout: HostLayout, rank: int, rails: Rails, rails_factory=None):
        self.local = local                  # this host's Communicator
        self.layout = layout
        self.rank, self.world_size = rank, layout.world_size
        self._rails = {"cpu": rails}
        rails.watch(self.relay_stop)        # NOTE [stop across hosts] in rails.py
        self._rails_factory = rails_factory  # device -> Rails (NCCL groups on first use)
        self.seq = -1       # the first rendezvous (init) is #0, the first call #1, as on one host
        ch = local.host.channel
        if ch is not None:      # host peers wait here while this rank talks to other hosts
            ch.spin, ch.sleep_after = min(ch.spin, 200), 3e-4
        self.scratch = Scratch()
        self.p2p_sent: dict[int, int] = {}
        self.p2p_recvd: dict[int, int] = {}
        self.p2p_blocks = None            # hier/p2p.py's two exchange blocks, made on first use

    # ---- Backend interface -------------------------------------------------------------------
    def algorithms(self, collective: str) -> list[str]:
        return algorithms_across_hosts(collective, self.layout)

    def check(self, collective, algo, dtype, op) -> None:
        if algo not in self.algorithms(collective):
            raise ValueError(f"{collective}: algorithm {algo!r} does not run on ranks that span "
                             f"hosts ({self.layout.describe()}); choose one of "
                             f"{', '.join(self.algorithms(collective))} or 'auto'")
        if algo == ENGINE and not engine.supports(collective, dtype):
            raise TypeError(f"{collective}: algorithm 'engine' (torch.distributed over all "
                            f"ranks) does not take {dtype} tensors; use "
                            f"{', '.join(hier_algorithms(collective, self.layout))} or 'auto'")

    def run(self, call: CollectiveCall) -> None:
        self.seq += 1
        if call.collective == "all_to_all_v" and call.recv_rows is None:
            call.recv_rows = self._learn_recv_rows(call)
            call.info["learned_rows"] = True     # consistent by construction: not re-checked
            call.buffers["out"] = call.make_out(sum(call.recv_rows))
        try:
            if call.algo == ENGINE:
                engine.run(self, call, self.seq)
                return
            plan = hier_plan(call.collective, call.algo, self.layout, call.root, self.rank)
            _Run(self, plan, call).execute()
        except CommAborted as e:
            self.relay_stop(e.by, e.reason, isinstance(e, CommRevoked))
            raise

    def reject(self, collective: str, message: str) -> None:
        """This rank refused a call. Its host peers learn it from the local communicator and
        pass it on in their next rail round. Its own rail partners are not told: which rails
        a call uses depends on arguments this rank could not read, and Gloo has no
        one-sided message (a send waits for the matching receive). So a partner that waits
        for this very rank (hier_rail; a host of one rank) raises CommTimeout after the
        timeout instead (docs/design.md "Across hosts", Limits)."""
        self.seq += 1
        self.local.host.reject(collective, message)

    def rendezvous(self, name: str, count: int, extra: int) -> list[int]:
        """Host peers meet (comparing ``count``), then every rail; ``extra`` of every rank."""
        self.seq += 1
        local = self.local.host.rendezvous(name, count, extra)
        r = self.rails_for("cpu")
        out = {p: local[i] for i, p in enumerate(self.layout.hosts[self.layout.host_of(self.rank)])}
        for c in self.layout.rails_of(self.rank):
            hdr = r.header(self.seq, name, "hier_rail", 0, count, 0, 0, 8)
            hdr[HDR_BYTES:HDR_BYTES + 8].view(torch.int64)[0] = extra
            for m, blk in zip(self.layout.rail(c), r.round1(c, hdr, name, self.seq)):
                out[m] = int(blk[HDR_BYTES:HDR_BYTES + 8].view(torch.int64)[0])
        # ranks of other hosts not on a shared rail: their host's value travels with the rail
        # member, which only knows its own host; alloc only needs agreement, so fill from it.
        return [out.get(p, out[self.rank]) for p in range(self.world_size)]

    def send(self, data: np.ndarray, dtype: DType, numel: int, peer: int, tag: int = 0) -> None:
        if self.layout.host_of(peer) == self.layout.host_of(self.rank):
            return self.local.host.backend.send(data, dtype, numel,
                                                self.layout.local_rank(peer), tag)
        from .p2p import send
        send(self, torch.from_numpy(data), dtype, numel, peer, tag)

    def recv(self, out: np.ndarray, dtype: DType, numel: int, peer: int, tag: int = 0) -> None:
        if self.layout.host_of(peer) == self.layout.host_of(self.rank):
            return self.local.host.backend.recv(out, dtype, numel,
                                                self.layout.local_rank(peer), tag)
        from .p2p import recv
        recv(self, torch.from_numpy(out), dtype, numel, peer, tag)

    def probe(self, peer: int) -> bool:
        if self.layout.host_of(peer) == self.layout.host_of(self.rank):
            return self.local.host.probe(self.layout.local_rank(peer))
        raise CommError(f"probe: rank {peer} is on another host; probe works between ranks of "
                        f"one host only")

    def abort_links(self, by: int, reason: str, revoke: bool) -> None:
        """``comm.abort`` / ``revoke`` on this rank: tell the other hosts (NOTE [stop across
        hosts] in rails.py)."""
        for r in self._rails.values():
            r.abort(by, reason, revoke)

    def relay_stop(self, by: int, reason: str, revoke: bool) -> None:
        """This rank learned that rank ``by`` stopped the communicator (from another host: the
        watcher's thread, or a failed exchange; or from its own host's stop word): pass it on
        to this host and through this rank's rails, so the calls in flight end now."""
        self.local.host.stop(revoke, reason, by)
        self.abort_links(by, reason, revoke)

    def close(self) -> None:
        for r in self._rails.values():
            r.close()
        self._rails.clear()
        self.local.close()

    @property
    def channel(self):
        """The host communicator's wait channel (``comm.host.cancel_waits`` ends its waits)."""
        return self.local.host.channel

    def alloc(self, shape, dtype):
        """Symmetric device memory among this host's ranks (collective over all ranks)."""
        t = self.local.alloc(shape, dtype, device="cuda")
        self.rendezvous("alloc", 0, 0)
        return t

    def synchronize(self) -> None:
        self.local.synchronize()

    def forget_calls(self) -> None:
        self.local.forget_calls()

    def host_communicator(self):
        return self.local

    def process_group(self, name: str, timeout: float | None = None, device: str = "cpu"):
        return self.rails_for(device).new_world_group(name, timeout)

    # ---- helpers -----------------------------------------------------------------------------
    def rails_for(self, device: str) -> Rails:
        r = self._rails.get(device)
        if r is None:
            if self._rails_factory is None:
                raise TypeError(f"no inter-host groups for {device} tensors")
            r = self._rails[device] = self._rails_factory(device)
        return r

    def _learn_recv_rows(self, call: CollectiveCall) -> list[int]:
        """all_to_all_v without recv_counts: a hierarchical all_to_all of the send counts."""
        send = torch.tensor([int(c) for c in call.send_rows], dtype=torch.int64)
        got = torch.empty_like(send)
        d = lookup_dtype(torch.int64)
        sub = CollectiveCall("all_to_all", "hier_direct", d, self.world_size,
                             {"in": send, "out": got})
        plan = hier_plan("all_to_all", "hier_direct", self.layout, 0, self.rank)
        _Run(self, plan, sub, label="all_to_all_v").execute()
        self.seq += 1
        return [int(x) for x in got]


class _Run:
    """One call of a hierarchical plan on this rank."""

    def __init__(self, be: HierBackend, plan: HierPlan, call: CollectiveCall, label=None):
        self.be, self.plan, self.call = be, plan, call
        self.what = label or call.collective
        self.lay = be.layout
        first = next(iter(call.buffers.values()), None)
        self.device = first.device if first is not None else torch.device("cpu")
        self.dtype = call.dtype.torch
        self.bufs: dict[str, torch.Tensor] = {}
        self.bounds: dict[str, list[int]] = {}
        self._padded = None
        self._setup()

    # chunk lengths (elements) of every buffer of the plan
    def _setup(self) -> None:
        call, plan, w = self.call, self.plan, self.lay.world_size
        host = self.lay.hosts[self.lay.host_of(self.be.rank)]
        lengths: dict[str, list[int]] = {}
        for name, n in plan.buffers:
            if call.collective == "all_to_all_v":
                row = call.count
                sr, rr = list(call.send_rows), list(call.recv_rows)
                lengths = {"in": [c * row for c in sr], "out": [c * row for c in rr],
                           "t1": [sr[p] * row for p in host], "t2": [rr[p] * row for p in host]}
                break
            if call.collective in ("all_reduce", "broadcast", "reduce"):
                unit = -(-call.count // plan.nchunks("buf"))
            elif call.collective == "all_gather":
                unit = call.count
            elif call.collective == "barrier":
                unit = 0
            else:
                unit = call.count // w
            lengths[name] = [unit] * n
        for name, ls in lengths.items():
            b = [0]
            for x in ls:
                b.append(b[-1] + x)
            self.bounds[name] = b
            if name in call.buffers:
                t = call.buffers[name]
                if t.numel() != b[-1]:          # all_reduce padded to whole chunks
                    self._padded = (name, t)
                    t = self.be.scratch.get("pad", b[-1], self.dtype, self.device)
                    t[:call.count] = call.buffers[name]
                    t[call.count:] = 0
                self.bufs[name] = t
            else:
                self.bufs[name] = self.be.scratch.get(name, b[-1], self.dtype, self.device)

    def view(self, reg: Region) -> torch.Tensor:
        b = self.bounds[reg.buf]
        return self.bufs[reg.buf][b[reg.first]:b[reg.first + reg.n]]

    @property
    def local_op(self):
        op = self.call.op
        return "sum" if op in (None, ReduceOp.AVG) else op.value

    # ---- walking the steps -------------------------------------------------------------------
    def execute(self) -> None:
        failed: BaseException | None = None
        for st in self.plan.steps:
            if failed is not None:
                if isinstance(st, Rail):
                    self._rail(st, failed)
                    break          # the other hosts have been told; nothing more to do
                continue
            try:
                if isinstance(st, Copy):
                    for d, s in st.pairs:
                        self.view(d).copy_(self.view(s))
                elif isinstance(st, Local):
                    try:
                        self._local(st)
                    except CommError as e:
                        raise self._globalized(e) from None
                elif isinstance(st, Rail):
                    try:
                        self._rail(st, None)
                    except CommError as e:
                        self._reject_next_local(st, e)
                        raise
                else:
                    self._exchange(st)
            except CommError as e:
                failed = e
        if failed is not None:
            raise failed
        if self._padded is not None:
            name, t = self._padded
            t.copy_(self.bufs[name][:t.numel()])

    def _globalized(self, e: CommError) -> CommError:
        """A host communicator's error in the call's terms: global ranks, the call's number."""
        host = self.lay.hosts[self.lay.host_of(self.be.rank)]
        names = ", ".join(f"local {i} = rank {g}" for i, g in enumerate(host))
        msg = (f"{self.what} #{self.be.seq}: the step inside host {self.lay.host_of(self.be.rank)}"
               f" failed ({names}): {e}")
        if isinstance(e, CommTimeout):
            missing = getattr(e, "reported_missing", None) or \
                tuple(host[m] for m in e.missing if 0 <= m < len(host))
            return CommTimeout(msg, collective=self.what, seq=self.be.seq, missing=missing)
        if isinstance(e, CommAborted):
            return type(e)(msg, by=e.by, reason=e.reason)
        return type(e)(msg)

    def _reject_next_local(self, st: Rail, err: CommError) -> None:
        steps = self.plan.steps
        nxt = steps.index(st) + 1
        if any(isinstance(s, Local) for s in steps[nxt:]):
            text = f"{type(err).__name__}: {err}"
            if isinstance(err, CommTimeout):       # the host peers name the same culprits
                text += f" (missing ranks {list(err.missing)})"
            self.be.local.host.reject(self.what, text)

    def _rows(self, t: torch.Tensor) -> torch.Tensor:
        """``t`` as rows of the call's row shape, so the host's handshake compares it too
        (with the rails' headers, every pair of ranks is then compared, directly or through
        a chain of hosts and rails)."""
        rows = self.call.row_shape
        return t.view(-1, *rows) if rows else t

    def _local(self, st: Local) -> None:
        lc = self.be.local
        c = st.collective
        src = self.view(st.src) if st.src.buf != "none" else None
        if c == "all_reduce":
            lc.all_reduce(src, op=self.local_op)
        elif c == "reduce_scatter":
            lc.reduce_scatter(src, op=self.local_op, out=self.view(st.dst))
        elif c == "all_gather":
            lc.all_gather(self._rows(src), out=self._rows(self.view(st.dst)))
        elif c == "broadcast":
            lc.broadcast(src, root=st.root)
        elif c == "reduce":
            lc.reduce(src, root=st.root, op=self.local_op)
        elif c == "all_to_all":
            lc.all_to_all(self._rows(src), out=self._rows(self.view(st.dst)))
        elif c == "all_to_all_v":
            host = self.lay.hosts[self.lay.host_of(self.be.rank)]
            row = self.call.count
            send = [self.call.send_rows[p] for p in host]
            recv = [self.call.recv_rows[p] for p in host]
            dst = self.view(st.dst)
            rows = self.call.row_shape if row else (0,)
            lc.all_to_all_v(src.view(sum(send), *rows), send, recv,
                            out=dst.view(sum(recv), *rows))
        elif c == "barrier":
            lc.barrier()
        else:
            raise AssertionError(f"no local step {c}")

    def _header(self, rails, nbytes: int, error=None):
        call = self.call
        op_id = OP_ID[call.op] if call.op is not None else 0
        return rails.header(self.be.seq, self.what, call.algo, call.dtype.id, call.count,
                            op_id, call.root, nbytes, error=error, rows=call.row_shape)

    def _rail(self, st: Rail, error) -> None:
        rails = self.be.rails_for(self.device.type if st.kind != "sync" else "cpu")
        hdr_rails = self.be.rails_for("cpu")
        seq, what = self.be.seq, self.what
        counts = raised = None
        if error is None and st.kind == "sync" and self.call.collective == "all_to_all_v" \
                and not self.call.info.get("learned_rows") and st.parts:
            try:
                counts = self._host_counts()
            except CommError as e:        # the other hosts must hear of it, not time out
                self._rail(st, e)
                raise
        for part in st.parts:
            mine = self.view(part.src) if part.src is not None else None
            if part.lengths:        # all_gather of host blocks of different sizes: pad
                unit = self.bounds[part.src.buf][1] - self.bounds[part.src.buf][0]
                padded = self.be.scratch.get("blocks", part.stride * unit, self.dtype,
                                             self.device)
                padded[:mine.numel()] = mine
                padded[mine.numel():] = 0
                mine = padded
            nbytes = 0 if mine is None else mine.numel() * mine.element_size()
            hdr = self._header(hdr_rails, nbytes, error)
            if error is None and mine is not None and nbytes <= SMALL \
                    and mine.device.type == "cpu":
                hdr[HDR_BYTES:HDR_BYTES + nbytes] = _bytes(mine)   # small: one round
            if counts is not None and counts.numel() <= SMALL:
                hdr[HDR_BYTES:HDR_BYTES + counts.numel()] = counts
            try:
                r1 = hdr_rails.round1(part.rail, hdr, what, seq, self.call.row_shape)
            except CommError as e:
                # a rank on several rails (uneven hosts) still joins the rounds of the rest,
                # with this error, so no partner there waits for it until the timeout
                if error is None:
                    error = raised = e
                continue
            if error is not None:
                continue
            if counts is not None:
                # every rail carries the blocks (a partner may be on this rail only); one rail
                # reaches every host, so the first gives the whole matrix, checked once every
                # rail's round is done (a rank on several rails must not leave one waiting)
                got = hdr_rails.all_gather(part.rail, counts, r1, what, seq, counts.numel(),
                                           self.be.scratch)
                if part is st.parts[0]:
                    check = (part, [g.clone() for g in got])
            if st.kind == "sync":
                continue
            if st.kind == "broadcast":
                rails.broadcast(part.rail, _bytes(self.view(part.dst)), part.root,
                                r1, what, seq, nbytes)
                continue
            if st.kind == "all_to_all":
                self._rail_all_to_all(rails, part, _bytes(mine), r1, nbytes)
                continue
            got = rails.all_gather(part.rail, _bytes(mine), r1, what, seq, nbytes,
                                   self.be.scratch)
            vals = [g.view(self.dtype) for g in got]
            self._combine(st, part, vals)
        if raised is not None:
            raise raised
        if counts is not None:
            self._check_split_sizes(*check)

    def _rail_all_to_all(self, rails, part, mine: torch.Tensor, r1, nbytes: int) -> None:
        """Member i's part i of ``mine`` (uint8, equal parts) lands in part ``me`` of its dst;
        from the header round when it fitted (every member carried all its parts)."""
        members = part.members
        me, k = members.index(self.be.rank), len(members)
        per = nbytes // k
        dst = _bytes(self.view(part.dst))
        if nbytes <= SMALL and mine.device.type == "cpu":
            for i, blk in enumerate(r1):
                dst[i * per:(i + 1) * per] = blk[HDR_BYTES + me * per:HDR_BYTES + (me + 1) * per]
            return
        rails.all_to_all(part.rail, mine, dst, self.what, self.be.seq)

    def _host_counts(self) -> torch.Tensor:
        """all_to_all_v: this host's rows of the split matrices (every host rank's send rows,
        then its expected receive rows), as a block of ``max_local`` x 2W int64 (the same size
        on every rank, so the rail exchange of it can never mismatch)."""
        w, call = self.lay.world_size, self.call
        expect = [-1] * w if call.recv_rows is None else [int(c) for c in call.recv_rows]
        rows = self.be.local.exchange([int(c) for c in call.send_rows] + expect)
        block = torch.full((self.lay.max_local, 2 * w), -1, dtype=torch.int64)
        block[:len(rows)] = torch.tensor(rows, dtype=torch.int64)
        return block.view(-1).view(torch.uint8)

    def _check_split_sizes(self, part, got: list[torch.Tensor]) -> None:
        """Every host's count block, from the members of one rail (one per host): every rank
        assembles the same matrices and raises the same CommMismatch if any pair disagrees
        (rows of another size than expected would be cut short or left unwritten)."""
        w = self.lay.world_size
        send, expect = [None] * w, [None] * w
        for m, blk in zip(part.members, got):
            host = self.lay.hosts[self.lay.host_of(m)]
            rows = blk.view(torch.int64).view(self.lay.max_local, 2 * w).tolist()
            for g, row in zip(host, rows):
                send[g], expect[g] = row[:w], row[w:]
        check_split_sizes(send, expect, f"{self.what} #{self.be.seq}")

    def _combine(self, st: Rail, part, vals: list[torch.Tensor]) -> None:
        members = part.members
        dst = self.view(part.dst) if part.dst is not None else None
        if st.kind == "all_gather":
            b = self.bounds[part.src.buf]
            unit = b[1] - b[0]                   # every chunk of an all_gather is one block
            for k, v in enumerate(vals):
                n = part.lengths[k] * unit if part.lengths else v.numel()
                off = k * (part.stride * unit if part.stride else v.numel())
                dst[off:off + n] = v[:n]
            return
        if st.kind == "reduce" and self.be.rank != part.root:
            return
        if st.kind == "reduce_scatter":
            i = members.index(self.be.rank)
            n = dst.numel()
            vals = [v[i * n:(i + 1) * n] for v in vals]
        self._reduce_into(dst, vals, st.completes)

    def _reduce_into(self, dst: torch.Tensor, vals: list[torch.Tensor], completes: bool) -> None:
        reduce_into(dst, vals, self.call.op, self.lay.world_size, completes)

    def _exchange(self, st: Exchange) -> None:
        rails = self.be.rails_for(self.device.type)
        sends = [(p, _bytes(self.view(r))) for p, r in st.sends]
        recvs = [(p, _bytes(self.view(r))) for p, r in st.recvs]
        rails.sendrecv(sends, recvs, self.what, self.be.seq)


def reduce_into(dst: torch.Tensor, vals: list[torch.Tensor], op: ReduceOp | None,
                world_size: int, completes: bool = True) -> None:
    """``dst`` = the reduction of ``vals`` in their order; 16-bit floats accumulate in float32
    and round once; avg divides by ``world_size`` where the sum ``completes``."""
    op = op or ReduceOp.SUM
    fn = _FN[op]
    wide = _WIDE.get(dst.dtype, dst.dtype)
    avg = op is ReduceOp.AVG and completes
    if wide == dst.dtype and len(vals) > 1:     # straight into dst, no temporary
        fn(vals[0], vals[1], out=dst)
        for v in vals[2:]:
            fn(dst, v, out=dst)
        if avg:
            dst.div_(world_size)
        return
    acc = vals[0].to(wide, copy=True)
    for v in vals[1:]:
        fn(acc, v.to(wide), out=acc)
    if avg:
        acc.div_(world_size)
    dst.copy_(acc)


def _bytes(t: torch.Tensor) -> torch.Tensor:
    return t.view(torch.uint8) if t.numel() else torch.empty(0, dtype=torch.uint8,
                                                             device=t.device)


class Scratch:
    """Temporaries of hierarchical calls, kept between calls (fresh large allocations cost a
    page fault per page on every call); one buffer per name, grown as needed, none kept above
    ``keep_bytes``."""

    def __init__(self, keep_bytes: int = 256 << 20):
        self.keep_bytes = keep_bytes
        self._bufs: dict[tuple, torch.Tensor] = {}

    def get(self, name: str, numel: int, dtype: torch.dtype, device) -> torch.Tensor:
        nbytes = numel * torch.empty((), dtype=dtype).element_size()
        key = (name, torch.device(device).type)
        buf = self._bufs.get(key)
        if buf is None or buf.numel() < nbytes or buf.device != torch.device(device):
            buf = torch.empty(nbytes, dtype=torch.uint8, device=device)
            if nbytes <= self.keep_bytes:
                self._bufs[key] = buf
        return buf[:nbytes].view(dtype)

"""Runs a registered schedule over the shared-memory heap (one rank's side).

For one collective call::

    post descriptor, stage inputs of piece 0, run leading local phases   -> step "ready"
    handshake: wait for every rank's "ready", compare descriptors        (mismatch: all raise)
    for each piece k:
        (k > 0) stage inputs of piece k, leading local phases             -> step "ready"
        for each phase p with remote reads:
            wait for schedule.waits_before(rank, p); do my moves          -> step "phase p done"
        copy staged outputs back; wait for schedule.waits_at_end(rank)

Buffers peers read must be in symmetric memory: a user tensor from ``comm.alloc`` is read where
it is (zero copy); any other tensor is staged through this rank's scratch. Each rank announces
where its buffers are in its descriptor, so peers may stage differently. Messages larger than
the scratch area run in pieces; every chunk contributes its ``k``-th slice of ``piece_elems``
elements to piece ``k`` (scratch keeps one slot of ``piece_elems`` per chunk).

NOTE [skipping the final wait]
    Scratch alternates halves by sequence parity. If peers read only this rank's scratch in the
    last phase, the rank may return without waiting for them: the next collective writes the
    other half, and the one after that starts only after every peer has posted the next one's
    handshake, i.e. finished this one. One synchronization per one_shot all_reduce.
"""

from __future__ import annotations

import os
import re
import zlib
import time
from contextlib import contextmanager

import numpy as np

from ...agree import compare
from ...algorithms.lower import USER_BUFFERS, piece_elems
from ...algorithms.placement import (CMA, HEAP, LOCAL, SMALL_CALL_BYTES, CpuPlan, cpu_plan,
                                     place, single_copy)
from ...settings import settings
from ...errors import CommError, CommMismatch, CommTimeout
from ...heap.base import SegmentLayout
from ...types import OP_BY_ID, OP_ID
from ..base import CollectiveCall, PreparedCall, check_split_sizes
from .channel import (ACT_COLLECTIVE, COLL_IDS, COLL_NAMES, D_ALGO, D_COLL, D_COUNT, D_DTYPE,
                      D_EXTRA, D_MSGLEN, D_OP, D_PIECE, D_PLACE, D_ROOT, D_ADDR, D_SEQ, ERROR_ID,
                      NUM_PLACES, Channel, algo_id)
from . import native as native_runner
from .cma import SINGLE_COPY_YES
from .native import (RUN_ABORTED, RUN_DONE, RUN_MISMATCH, RUN_PLACES, RUN_READ_ERROR, RUN_WAIT,
                     NativeProgram)
from .plan import (PLACE_CMA, PLACE_LOCAL, PLACE_SCRATCH, Addresser, PeerReadError, Runner,
                   make_layout, phase_template, stage_template, underlying)

_CACHE_ENTRIES = 64


class _Template:
    """Everything about a call that does not depend on the caller's memory (cached by call
    signature and places, for any size)."""

    __slots__ = ("prog", "layout", "places", "fields", "pre", "post", "phases", "native")

    def __init__(self, prog, layout, places, fields, pre, post):
        self.prog, self.layout, self.places, self.fields = prog, layout, places, fields
        self.pre, self.post = pre, post     # ops: staging + leading local phases; copy-back
        self.phases: dict = {}              # peers' places -> ops per remaining phase
        #: the native program for the places the peers announced last time (None: not
        #: built yet, or the native runner is off)
        self.native: NativeProgram | None = None


class _Ready:
    """A small call's callables over the caller's memory (cached by buffer addresses), or
    its native program with the base addresses of that memory."""

    __slots__ = ("tpl", "pre", "post", "phases", "peer_places", "native", "bases")

    def __init__(self, tpl, pre, post, native=None, bases=None):
        self.tpl, self.pre, self.post = tpl, pre, post
        self.phases = None
        self.peer_places = None
        self.native, self.bases = native, bases


def _bounded_put(cache: dict, key, value) -> None:
    if len(cache) >= _CACHE_ENTRIES:
        cache.pop(next(iter(cache)))
    cache[key] = value


class Executor:
    """Executes collective schedules for one rank of a shared-memory communicator."""

    def __init__(self, channel: Channel, heap, scratch_bytes: int):
        self.ch = channel
        self.heap = heap
        self.rank, self.world_size = channel.rank, channel.world_size
        self.layout = heap.layout
        # Cache-sized pieces pay a synchronization each; when ranks outnumber cores every
        # synchronization may wait for a context switch, so fewer, larger pieces win there.
        oversubscribed = self.world_size > (os.cpu_count() or 1)
        self.half_bytes = min(scratch_bytes // 2,
                              settings().piece_bytes * (4 if oversubscribed else 1))
        self.segs = [heap.segment(r) for r in range(self.world_size)]
        self.seq = 0
        self._row_shape: tuple = ()         # the current call's (for _explain_mismatch)
        self._templates: dict = {}
        self._ready: dict = {}
        #: whether plans run through the native runner (TILECOMM_NATIVE, and it was built);
        #: may be switched per call (tests run both paths on one communicator)
        self.native = native_runner.enabled(self.world_size)
        self._segs_addr = [int(seg.ctypes.data) for seg in self.segs]
        #: whether every rank can read every peer's memory with process_vm_readv (None: not
        #: known yet; see _single_copy), and the smallest call that does
        self.cma: bool | None = None
        self.cma_min_bytes = settings().cma_min_bytes
        #: the process's tracer under TILECOMM_TRACE (handshake and phase events), or None
        self.trace = None

    def forget_calls(self) -> None:
        """Drop the ready-made steps of the calls the Communicator does not keep, and the
        templates (see ``Communicator.forget_calls``). A kept call's own steps and native
        programs (``PreparedCall.ready``, ``.native``) go with the memo that holds it."""
        self._ready.clear()
        self._templates.clear()

    # ---- entry points ---------------------------------------------------------------------
    def run(self, call: CollectiveCall, prepared: PreparedCall | None = None) -> None:
        """Run ``call``; ``prepared``: the PreparedCall it came from (a memoized call: its
        native programs per scratch parity are kept there, NOTE [prepared calls])."""
        # _guard written out: this is every collective's path, and at 8 bytes the native
        # runner's own work is about 0.3 us while each Python frame around it costs 30-80 ns
        # (docs/benchmarks.md, "The per-call path")
        ch = self.ch
        if ch.broken:
            self._check_usable()
        seq = self.seq
        self.seq = seq + 1
        name = call.collective
        # a prepared call keeps its native programs per scratch parity: no key to build and
        # hash, no _run frame
        ready = None
        if prepared is not None and self.native and self.trace is None:
            per = prepared.native
            if per is not None:
                ready = per[seq & 1]
        published = ch.begin(ACT_COLLECTIVE, COLL_IDS.get(name, 0), seq)
        try:
            if ready is None:
                self._run(call, seq, prepared)
            else:
                prog, bases = ready
                res = prog.run(bases[1], seq, ch.step)
                ch.step = prog.step
                if res != RUN_DONE:
                    self._row_shape = call.row_shape     # for _explain_mismatch
                    self._run_native(call, seq, prog, bases, res, prepared)
        except PeerReadError as e:
            e = PeerReadError(e.peer, e.detail, f"{name} #{seq} on rank {self.rank}")
            self._failed(name, seq, e)
            raise e from None
        except BaseException as e:
            self._failed(name, seq, e)
            raise
        finally:
            if published and not ch.broken:   # a broken one shows where it stopped
                ch.end()

    def _failed(self, name: str, seq: int, e: BaseException) -> None:
        """A timeout or an interruption leaves the ranks out of step, so the communicator is
        marked unusable. Errors every rank raised at the same step (mismatches, rejected
        calls) leave it consistent."""
        if isinstance(e, (CommTimeout, PeerReadError)):
            self.ch.broken = f"{name} #{seq} failed: {e}"
            if isinstance(e, PeerReadError):
                # peers waiting for this rank's flags stop at once instead of timing out
                self.ch.me[SegmentLayout.ABORT] = seq + 1
        elif not isinstance(e, CommError):
            self.ch.broken = f"{name} #{seq} was interrupted on rank {self.rank}"

    @contextmanager
    def _guard(self, name: str):
        """Take the next sequence number for a call that is not a collective (see run)."""
        self._check_usable()
        seq = self.seq
        self.seq += 1
        published = self.ch.begin(ACT_COLLECTIVE, COLL_IDS.get(name, 0), seq)
        try:
            yield seq
        except BaseException as e:
            self._failed(name, seq, e)
            raise
        finally:
            if published and not self.ch.broken:
                self.ch.end()

    def reject(self, collective: str, message: str) -> None:
        """Post an error descriptor for the next sequence number so peers raise, not hang."""
        with self._guard(collective) as seq:
            self._reject(collective, message, seq)

    def _reject(self, collective: str, message: str, seq: int) -> None:
        n = self.ch.post_message(seq, f"{collective}: {message}")
        fields = [0] * (D_MSGLEN + 1)
        fields[D_SEQ], fields[D_COLL], fields[D_MSGLEN] = seq, ERROR_ID, n
        self.ch.post_desc(seq, fields)
        # Wait for everyone to arrive, like any collective: a rank that returned early could
        # start the next collective while a peer still reads its scratch from the last one.
        step = self.ch.advance()
        self.ch.wait_progress(range(self.world_size), step,
                              (collective, seq, "every rank to arrive"))

    def rendezvous(self, name: str, count: int, extra: int) -> list[int]:
        """A handshake with no data (barrier, alloc); returns every rank's ``extra``."""
        with self._guard(name) as seq:
            t0 = time.time_ns() if self.trace is not None else 0
            # ``extra`` may differ per rank: it travels in the (uncompared) place slot.
            fields = self._fields(seq, name, "direct", 0, count, None, 0, 0, 0, (extra,))
            self.ch.post_desc(seq, fields)
            descs = self._handshake(seq, name, fields)
            if name == "init" and self.trace is not None:
                self.trace.synced(t0)    # every rank leaves here together: the clock mark
            return [d[D_PLACE] for d in descs]

    def _check_usable(self) -> None:
        if self.ch.broken:
            raise self.ch.unusable()

    # ---- descriptor handshake -------------------------------------------------------------
    @staticmethod
    def _fields(seq, coll, algo, dtype_id, count, op, root, extra, piece, places):
        f = [0] * (D_PLACE + NUM_PLACES)
        f[D_SEQ], f[D_COLL], f[D_ALGO], f[D_DTYPE] = seq, COLL_IDS[coll], algo_id(algo), dtype_id
        f[D_COUNT], f[D_OP], f[D_ROOT], f[D_EXTRA] = count, OP_ID[op] if op else 0, root, extra
        f[D_PIECE] = piece
        for i, p in enumerate(places):
            f[D_PLACE + i] = p
        return f

    def _handshake(self, seq: int, coll: str, mine: list[int]) -> list[list[int]]:
        """Publish 'ready', wait for every rank's, and check all ranks called the same thing."""
        ch = self.ch
        t0 = time.time_ns() if self.trace is not None else 0
        step = ch.advance()
        ch.wait_progress(range(self.world_size), step, (coll, seq, "every rank to arrive"))
        ch.check_aborts(range(self.world_size), (coll, seq, ""))
        base = ch.desc_base(seq)
        ref = mine[1:D_PLACE]
        descs = []
        for r in range(self.world_size):
            d = mine if r == self.rank else ch.slots[r][base:base + D_MSGLEN].tolist()
            if d[1:D_PLACE] != ref:
                self._explain_mismatch(seq, coll, mine)
            descs.append(d)
        if self.trace is not None:
            self.trace.span("handshake", t0, {"op": coll, "seq": seq})
        return descs

    def _explain_mismatch(self, seq: int, coll: str, mine: list[int]) -> None:
        ch = self.ch
        descs = [mine if r == self.rank else ch.read_desc(r, seq) for r in range(self.world_size)]
        for r, d in enumerate(descs):
            if d[D_COLL] == ERROR_ID:
                text = ch.read_message(r, seq, d[D_MSGLEN])
                # a rank that gave up because of a mismatch or a timeout elsewhere (another
                # host's leg of a hierarchical call) passes the same kind of error on
                reason = text.split(": ", 1)[-1]
                cls = CommMismatch if reason.startswith("CommMismatch") else CommError
                if reason.startswith("CommTimeout"):
                    err = CommTimeout(f"{coll} #{seq}: rank {r} gave up: {text}",
                                      collective=coll, seq=seq)
                    # the ranks it names are the enclosing call's (hier/backend.py)
                    m = re.search(r"\(missing ranks \[([\d, ]*)\]\)$", text)
                    err.reported_missing = tuple(int(x) for x in m.group(1).split(",")
                                                 if x.strip()) if m else ()
                    raise err
                raise cls(f"{coll} #{seq}: rank {r} rejected its call: {text}")
        count_label = "bytes" if coll == "alloc" else "count"
        # D_EXTRA is a hash of the row shape: this rank knows only its own shape
        mine_shape = self._row_shape
        row = (lambda v: str(mine_shape) if v == descs[self.rank][D_EXTRA]
               else f"not {mine_shape}")
        compare(f"{coll} #{seq}", descs, [
            (D_COLL, "collective", lambda v: _show(D_COLL, v)),
            (D_DTYPE, "dtype", lambda v: _show(D_DTYPE, v)), (D_COUNT, count_label, str),
            (D_OP, "op", lambda v: _show(D_OP, v)), (D_ROOT, "root", str),
            (D_ALGO, "algorithm", lambda v: _show(D_ALGO, v)),
            (D_EXTRA, "the row shape (the dims after dim 0; the element counts agree)", row),
            (D_PIECE, "piece size (TILECOMM_PIECE_BYTES / TILECOMM_SCRATCH_BYTES)", str)])
        raise CommMismatch(f"{coll} #{seq}: ranks disagree on the call")

    # ---- one collective -------------------------------------------------------------------
    def _heap_offset(self, arr) -> int | None:
        off = self.heap.offset_of(arr) if arr is not None else None
        return off if off is not None and off >= self.layout.heap_offset else None

    def _template(self, call: CollectiveCall, seq: int, counts=None, places=None) -> _Template:
        """``places``: the ones this rank announced already (all_to_all_v)."""
        prog = cpu_plan(call.collective, call.algo, self.world_size, call.root, self.rank)
        if places is None:
            cma = self._single_copy(call)
            places = tuple(self._place(b, call, prog, cma) for b in prog.names)
        key = (call.collective, call.algo, call.root, call.dtype.id, call.count, call.op,
               seq & 1, places, None if counts is None else tuple(map(tuple, counts)),
               call.row_shape)
        tpl = self._templates.get(key)
        if tpl is not None:
            return tpl
        me = self.rank
        layout = make_layout(prog, self.world_size, call.count, call.dtype, self.half_bytes,
                             counts)
        fields = self._fields(seq, call.collective, call.algo, call.dtype.id, call.count,
                              call.op, call.root, shape_id(call.row_shape), layout.piece, places)
        addr = Addresser(prog, layout, [places] * self.world_size,
                         self.layout.scratch_half(seq & 1))
        pre = stage_template(addr, call.collective, me, inbound=True)
        for p in range(prog.lead):
            pre += phase_template(addr, p, me)
        post = [] if (call.collective == "reduce" and me != call.root) else \
            stage_template(addr, call.collective, me, inbound=False)
        tpl = _Template(prog, layout, places, fields, pre, post)
        _bounded_put(self._templates, key, tpl)
        return tpl

    def _phase_ops(self, tpl: _Template, seq: int, peer_places) -> list:
        ops = tpl.phases.get(peer_places)
        if ops is None:
            addr = Addresser(tpl.prog, tpl.layout, peer_places, self.layout.scratch_half(seq & 1))
            ops = [phase_template(addr, p, self.rank)
                   for p in range(tpl.prog.lead, len(tpl.prog.sched.phases))]
            if len(tpl.phases) < 8:
                tpl.phases[peer_places] = ops
        return ops

    def _run(self, call: CollectiveCall, seq: int, prepared: PreparedCall | None) -> None:
        """``run`` of a call without a prepared native program for this parity."""
        self._row_shape = call.row_shape
        if call.collective == "all_to_all_v":
            with np.errstate(all="ignore"):   # overflow is the data's business, as in torch
                return self._run_variable(call, seq)
        # Where this call's ready-made steps are kept: on the prepared call the Communicator
        # keeps (a call with a memo key; not while the single-copy probe is unknown: the
        # places would be kept), or, for other small calls, under their buffers' addresses.
        kept = prepared if (prepared is not None and call.cache_key is not None
                            and self.cma is not None) else None
        key = None
        if kept is None and call.cache_key is None and \
                sum(a.nbytes for a in call.buffers.values()) <= SMALL_CALL_BYTES:
            key = (call.collective, call.algo, call.root, call.dtype.id, call.count, call.op,
                   seq & 1, tuple((b, a.ctypes.data, a.nbytes) for b, a in call.buffers.items()),
                   call.row_shape)
        if kept is not None:
            ready = kept.ready[seq & 1] if kept.ready is not None else None
        else:
            ready = self._ready.get(key) if key is not None else None
        if ready is not None:
            if self.native and self.trace is None:
                prog = ready.tpl.native
                if prog is not None and ready.native is not prog:
                    # built after this call's first (Python) run, or rebuilt for the places
                    # the peers announced since
                    ready.native, ready.bases = prog, prog.bases(self._segs_addr, call.buffers)
                if ready.native is not None:
                    if kept is not None:
                        if kept.native is None:
                            kept.native = [None, None]
                        kept.native[seq & 1] = (ready.native, ready.bases)
                    return self._run_native(call, seq, ready.native, ready.bases, None,
                                            prepared)
            tpl = ready.tpl
        else:
            tpl = self._template(call, seq)
            if self.native and self.trace is None:
                if tpl.native is None:
                    # expect every rank to place its buffers as this one does (the handshake
                    # checks; a peer that placed them otherwise sends the call to Python)
                    self._build_native(tpl, call, seq, (tuple(tpl.places),) * self.world_size)
                bases = tpl.native.bases(self._segs_addr, call.buffers)
                self._keep_ready(kept, key, seq & 1, _Ready(tpl, None, None, tpl.native, bases))
                return self._run_native(call, seq, tpl.native, bases, None, prepared)
        with np.errstate(all="ignore"):   # overflow is the data's business, as in torch
            self._run_python(call, seq, tpl, ready, kept, key)

    def _keep_ready(self, kept: PreparedCall | None, key, parity: int, ready: _Ready) -> None:
        """Keep a call's ready-made steps: on its prepared call, or under ``key``."""
        if kept is not None:
            if kept.ready is None:
                kept.ready = [None, None]
            kept.ready[parity] = ready
        elif key is not None:
            _bounded_put(self._ready, key, ready)

    def _run_python(self, call: CollectiveCall, seq: int, tpl: _Template, ready, kept,
                    key) -> None:
        """The call on the Python path (numpy/torch calls between the flag waits); its first
        run of a template builds the native program the next runs take."""
        ch = self.ch
        runner = None
        if ready is not None and ready.pre is None:   # made by the native path: no callables
            ready = None
        if ready is None:
            runner = Runner(self.segs, call.buffers, tpl.layout, call.op, self.world_size)
            # callables hold views of the caller's memory: small calls only
            if (kept is not None or key is not None) and tpl.layout.pieces == 1 and \
                    sum(a.nbytes for a in call.buffers.values()) <= SMALL_CALL_BYTES:
                ready = _Ready(tpl, runner.calls(tpl.pre, 0), runner.calls(tpl.post, 0))
                self._keep_ready(kept, key, seq & 1, ready)
        fields = tpl.fields
        fields[D_SEQ] = seq
        ch.post_desc(seq, fields)
        self._post_addresses(seq, tpl.prog, tpl.places, call.buffers)
        if ready is not None:
            for f in ready.pre:
                f()
        else:
            runner.run(tpl.pre, 0)
        descs = self._handshake(seq, call.collective, fields)
        self._pieces(call, seq, tpl, descs, runner, ready, first_ready=True)

    def _build_native(self, tpl: _Template, call: CollectiveCall, seq: int, peer_places) -> None:
        tpl.native = NativeProgram(
            tpl, self._phase_ops(tpl, seq, peer_places), peer_places, rank=self.rank,
            world=self.world_size, op=call.op, desc_base=self.ch.desc_base(seq),
            spin=self.ch.spin)

    def _run_native(self, call: CollectiveCall, seq: int, prog: NativeProgram, bases,
                    res: int | None = None, prepared: PreparedCall | None = None) -> None:
        """The whole call through the native runner; waits that outlast its spin, and errors,
        come back here (see native.py). ``res``: the result of the program's first run, when
        the caller started it (``run``, for a memoized call)."""
        ch = self.ch
        addr = bases[1]
        if res is None:
            res = prog.run(addr, seq, ch.step)
        while True:
            ch.step = prog.step
            if res == RUN_DONE:
                return
            if res == RUN_WAIT:
                ranks, detail = prog.pending_wait()
                ch.wait_progress(ranks, ch.step, (call.collective, seq, detail))
                prog.skip_wait()
                res = prog.run(addr, -1, 0)
                continue
            if res == RUN_READ_ERROR:
                peer, err = prog.read_error()
                raise PeerReadError(peer, os.strerror(err))
            if res == RUN_ABORTED:
                ch.check_aborts(range(self.world_size), (call.collective, seq, ""))
            descs = [ch.slots[r][ch.desc_base(seq):ch.desc_base(seq) + D_MSGLEN].tolist()
                     for r in range(self.world_size)]
            if res == RUN_MISMATCH or res == RUN_ABORTED:
                self._explain_mismatch(seq, call.collective, descs[self.rank])
            assert res == RUN_PLACES, res
            # the peers placed their buffers otherwise: finish on the Python path
            if prepared is not None:
                prepared.native = None
            tpl = prog.template
            runner = Runner(self.segs, call.buffers, tpl.layout, call.op, self.world_size)
            with np.errstate(all="ignore"):
                return self._pieces(call, seq, tpl, descs, runner, None, first_ready=True)

    def _run_variable(self, call: CollectiveCall, seq: int) -> None:
        """all_to_all_v: chunk lengths come from the count matrix, known after the handshake."""
        ch, me, w = self.ch, self.rank, self.world_size
        self._post_rows(seq, call)
        prog = cpu_plan(call.collective, call.algo, w, call.root, me)
        cma = self._single_copy(call)
        places = tuple(self._place(b, call, prog, cma) for b in prog.names)
        # The piece size depends only on the settings: announce it like every collective does.
        piece = piece_elems(prog, call.dtype.itemsize, self.half_bytes)
        fields = self._fields(seq, call.collective, call.algo, call.dtype.id, call.count,
                              call.op, call.root, shape_id(call.row_shape), piece, places)
        ch.post_desc(seq, fields)
        self._post_addresses(seq, prog, places, call.buffers)
        descs = self._handshake(seq, call.collective, fields)
        rows = self._read_matrix(seq)
        if call.buffers.get("out") is None:
            call.buffers["out"] = call.make_out(sum(rows[j][me] for j in range(w)))
        counts = [[x * call.count for x in row] for row in rows]
        # the places announced (the output allocated since must not change the decision)
        tpl = self._template(call, seq, counts, places)
        runner = Runner(self.segs, call.buffers, tpl.layout, call.op, self.world_size)
        self._pieces(call, seq, tpl, descs, runner, None, first_ready=False)

    def _pieces(self, call, seq, tpl: _Template, descs, runner, ready,
                first_ready: bool) -> None:
        """Run every piece after the handshake (piece 0's staging is done if first_ready);
        ``descs``: every rank's descriptor."""
        ch, trace = self.ch, self.trace
        prog = tpl.prog
        peer_places = _peer_places(descs, prog)
        remote = self._remote(descs, prog)
        pieces = tpl.layout.pieces
        if self.native and trace is None and first_ready and (
                tpl.native is None or tpl.native.peer_places != peer_places):
            # the next call of this template runs natively (it expects these places)
            self._build_native(tpl, call, seq, peer_places)
        phases = None
        if ready is not None and ready.peer_places == peer_places and not remote:
            phases = ready.phases            # ready-made callables for the only piece
        else:
            templates = self._phase_ops(tpl, seq, peer_places)
            if ready is not None:
                runner = Runner(self.segs, call.buffers, tpl.layout, call.op, self.world_size)
                if not remote:   # peers' addresses may change between calls: not kept
                    ready.phases = phases = [runner.calls(ops, 0) for ops in templates]
                    ready.peer_places = peer_places
        if runner is not None:
            runner.remote = remote
        for k in range(pieces):
            if k > 0 or not first_ready:
                runner.run(tpl.pre, k)
                ch.advance()
            step0 = ch.step
            for i in range(len(prog.sched.phases) - prog.lead):
                t0 = time.time_ns() if trace is not None else 0
                waits = prog.phases[prog.lead + i].waits
                if waits:
                    ch.wait_progress(waits, step0 + i,
                                     (call.collective, seq, f"phase {prog.lead + i} of piece {k}"))
                if phases is not None:
                    for f in phases[i]:
                        f()
                else:
                    runner.run(templates[i], k)
                ch.advance()
                if trace is not None:
                    trace.span(f"phase {prog.lead + i}", t0,
                               {"op": call.collective, "seq": seq, "piece": k,
                                "waits": sorted(waits) if waits else []})
            if ready is not None:
                for f in ready.post:
                    f()
            else:
                runner.run(tpl.post, k)
            # NOTE [skipping the final wait]: peers that only read scratch need no wait.
            if prog.end_waits and not (k == pieces - 1 and all(
                    tpl.places[i] == PLACE_SCRATCH for i in prog.last_read_bufs)):
                ch.wait_progress(prog.end_waits, ch.step,
                                 (call.collective, seq, f"readers of piece {k}"))

    def _place(self, buf: str, call: CollectiveCall, prog: CpuPlan, cma: bool) -> int:
        """Where ``buf`` lives for this call (NOTE [placement] in algorithms/placement.py): an offset in
        this rank's segment (a symmetric tensor; symmetric tensors are addressed through the
        segment even when only this rank reads them, so cached plans never hold a view that
        keeps a heap block alive), or PLACE_CMA / PLACE_LOCAL / PLACE_SCRATCH. ``cma``: peers
        may read the caller's memory in place (see _single_copy)."""
        if buf in USER_BUFFERS:
            arr = call.buffers.get(buf)
        else:                           # scratch: an alias of the caller's buffer, or scratch
            spec = prog.sched.buffer(buf)
            arr = call.buffers.get(spec.like) if spec.alias else None
        off = self._heap_offset(arr)
        where = place(prog, buf, in_heap=off is not None, single_copy=cma,
                      present=arr is not None)
        if where == HEAP:
            return off
        return PLACE_CMA if where == CMA else PLACE_LOCAL if where == LOCAL else PLACE_SCRATCH

    def _single_copy(self, call: CollectiveCall) -> bool:
        """Whether this call lets peers read the caller's tensors in place with
        process_vm_readv (cma.py) instead of staging them: every rank could read every peer
        at start (SegmentLayout.CMA), and the call is large enough (TILECOMM_CMA_MIN_BYTES)
        for the system call and the page pinning to cost less than the staging copy."""
        if self.cma is None:
            states = {int(self.ch.slots[r][SegmentLayout.CMA]) for r in range(self.world_size)}
            if 0 in states:
                return False        # a peer has not finished its probe yet: stage this time
            self.cma = states == {SINGLE_COPY_YES}
        return single_copy(sum(a.nbytes for a in call.buffers.values() if a is not None),
                           enabled=self.cma, min_bytes=self.cma_min_bytes)

    def _post_addresses(self, seq: int, prog: CpuPlan, places, buffers: dict) -> None:
        """Announce where this rank's PLACE_CMA buffers lie (descriptor slots D_ADDR)."""
        if PLACE_CMA not in places:
            return
        base = self.ch.desc_base(seq) + D_ADDR
        for i, b in enumerate(prog.names):
            if places[i] == PLACE_CMA:
                self.ch.me[base + i] = buffers[underlying(prog, b)].ctypes.data

    def _remote(self, descs, prog: CpuPlan) -> dict:
        """(peer, buffer) -> (pid, address) of the peers' PLACE_CMA buffers."""
        out = {}
        for r, d in enumerate(descs):
            if r == self.rank:
                continue
            for i, b in enumerate(prog.names):
                if d[D_PLACE + i] == PLACE_CMA:
                    out[(r, b)] = (int(self.ch.slots[r][SegmentLayout.PID]), d[D_ADDR + i])
        return out

    # ---- all_to_all_v rows ----------------------------------------------------------------
    def _post_rows(self, seq: int, call: CollectiveCall) -> None:
        lay, me = self.layout, self.ch.me
        s0, r0 = lay.row_slot(seq & 1, 0), lay.row_slot(seq & 1, 1)
        for j in range(self.world_size):
            me[s0 + j] = int(call.send_rows[j])
            me[r0 + j] = -1 if call.recv_rows is None else int(call.recv_rows[j])

    def _read_matrix(self, seq: int) -> list[list[int]]:
        """The exchanged send matrix (rows), after checking every rank's recv rows."""
        lay, w = self.layout, self.world_size
        s0, r0 = lay.row_slot(seq & 1, 0), lay.row_slot(seq & 1, 1)
        send = [self.ch.slots[r][s0:s0 + w].tolist() for r in range(w)]
        recv = [self.ch.slots[r][r0:r0 + w].tolist() for r in range(w)]
        check_split_sizes(send, recv, f"all_to_all_v #{seq}")
        return send


def _peer_places(descs: list[list[int]], prog: CpuPlan) -> tuple:
    """Where every rank announced its buffers (``places[rank][buffer index]``)."""
    n = len(prog.names)
    return tuple(tuple(d[D_PLACE:D_PLACE + n]) for d in descs)


def shape_id(shape: tuple) -> int:
    """A descriptor field standing for a row shape (0 for none)."""
    return zlib.crc32(repr(tuple(shape)).encode()) & 0x7FFFFFFF if shape else 0


def _show(idx: int, v: int) -> str:
    if idx == D_COLL:
        return COLL_NAMES.get(v, "error" if v == ERROR_ID else str(v))
    if idx == D_OP:
        return OP_BY_ID[v].value if v in OP_BY_ID else "none"
    if idx == D_DTYPE:
        from ...types import DTYPE_BY_ID
        return DTYPE_BY_ID[v].name if v in DTYPE_BY_ID else str(v)
    if idx == D_ALGO:
        from ...algorithms.registry import all_algorithms
        names = {algo_id(a): a for _, a in all_algorithms()}
        return names.get(v, str(v))
    return str(v)

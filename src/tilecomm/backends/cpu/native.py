"""The executor's plans as programs for the native runner (``_native.c``).

A :class:`NativeProgram` is one template of the executor (one call signature, placement and
scratch parity, for any buffers) together with the places its peers announced, written as a
flat ``int64`` array: the descriptor post, the staging and every phase's reductions, the step
flags and the waits, per piece. ``run`` executes the whole call in one native call; whatever
is slow or exceptional comes back to Python, which keeps every promise of the Python path:

* a wait still pending after the spin budget (``WAIT_BUDGET_NS``) returns; Python finishes it
  with ``Channel.wait_progress`` (CommTimeout naming the collective, sequence number and
  missing ranks, dead-peer detection, the flight recorder) and the program resumes after it;
* a descriptor that differs from this rank's -> the executor's mismatch explanation
  (CommMismatch or the peer's rejection, on every rank); a peer that gave up -> CommError;
* peers that placed their buffers otherwise than when the program was built -> the executor
  finishes the call on its Python path.

The runner is a C extension built at install time (``setup.py``, optional: without a compiler
the install still succeeds and the Python path runs). ``TILECOMM_NATIVE=0`` turns it off; the
tests run both. Chosen over a JIT (numba) because the per-call cost is the point: a CPython
extension call costs ~0.1 us and needs no compile at first use, and it keeps dependencies at
torch, numpy and a C compiler that setuptools finds.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from ...settings import settings
from ...types import ReduceOp
from .channel import D_ADDR, D_PLACE, NUM_PLACES
from .plan import PLACE_CMA, PLACE_SCRATCH, Op, Operand, underlying

try:
    from . import _native
except ImportError:     # not built (no compiler at install time): the Python path runs
    _native = None

# keep in step with _native.c
H_PIECES, H_PIECE, H_DTYPE, H_OP, H_SCALE, H_ITEMSIZE, H_WORLD, H_RANK, H_DESC, H_DESC_CMP, \
    H_NPLACES, H_SPIN, H_BUDGET_NS, H_LEN, H_NOGIL, H_REMOTE, H_DESC_ADDR = range(17)
S_SEQ, S_STEP, S_K, S_PC, S_ERRNO, S_PEER, S_LEN = range(7)
I_OP, I_ADVANCE, I_WAIT, I_POSTDESC, I_HANDSHAKE, I_POSTADDR = range(1, 7)
W_ALWAYS, W_FIRST, W_NOT_FIRST, W_NOT_LAST = range(4)
RUN_DONE, RUN_WAIT, RUN_MISMATCH, RUN_ABORTED, RUN_PLACES, RUN_READ_ERROR = range(6)

#: DType.id -> the runner's dtype code; ReduceOp -> its op code
DTYPE_CODES = {1: 0, 2: 1, 3: 2, 4: 3, 5: 4, 6: 5, 7: 6, 8: 7}
OP_CODES = {ReduceOp.SUM: 0, ReduceOp.PROD: 1, ReduceOp.MIN: 2, ReduceOp.MAX: 3,
            ReduceOp.AVG: 4}
#: operands one reduction may have in the runner (MAX_OPS in _native.c): a reduction has at
#: most one per rank plus its destination, so larger worlds stay on the Python path
MAX_OPERANDS = 64
#: how long the runner spins and yields on a flag before handing the wait to Python (which
#: then waits with its timeout, liveness checks and naps, and lets other threads run)
WAIT_BUDGET_NS = 200_000
#: programs moving more bytes than this release the GIL while they run
NOGIL_BYTES = 64 << 10


def enabled(world_size: int = 1) -> bool:
    """Whether collectives of ``world_size`` ranks run through the native runner (built, not
    turned off, and the world small enough for its operand limit)."""
    return _native is not None and settings().native and world_size + 1 <= MAX_OPERANDS


class Folded(NamedTuple):
    """An operation that also stores its result at ``dst2`` (see :func:`fold_copies`)."""

    op: Op
    dst2: Operand


def fold_copies(phase_ops: list[list[Op]], shared=frozenset()) -> list[list[Op | Folded]]:
    """The phases' operations with a copy of a result into the caller's memory folded into the
    pass that makes the result.

    two_shot's owner reduces its chunk into scratch (for its peers to read) and, a phase later,
    copies it into its own tensor: one more read and write of the chunk. The reduction can
    store it there too when the copy's destination is the caller's memory (``rank`` None: no
    peer reads it) and nothing in between touches that chunk. Same bits (the same values are
    stored); only this rank's own memory is written a phase earlier. Not into ``shared``:
    the caller's buffers that peers read in place (PLACE_CMA), where a phase earlier is too
    early.
    """
    phases: list[list] = [list(p) for p in phase_ops]
    for i in range(len(phases) - 1):
        for j, red in enumerate(phases[i]):
            if isinstance(red, Folded):
                continue
            for jj, cp in enumerate(phases[i + 1]):
                if (not isinstance(cp, Op) or len(cp.srcs) != 1 or cp.first_reduce
                        or cp.dst.rank is not None or cp.dst.buf in shared
                        or cp.srcs[0] != red.dst
                        or cp.chunk != red.chunk):
                    continue
                x = cp.dst
                between = phases[i][j + 1:] + phases[i + 1][:jj]
                if any(v.rank is None and v.buf == x.buf and v.off0 == x.off0
                       for o in between if o is not None for v in _operands(o)):
                    continue
                phases[i][j] = Folded(red, x)
                phases[i + 1][jj] = None
                break
    return [[o for o in p if o is not None] for p in phases]


def _operands(item: Op | Folded) -> tuple[Operand, ...]:
    if isinstance(item, Folded):
        return (item.op.dst, item.dst2, *item.op.srcs)
    return (item.dst, *item.srcs)


class NativeProgram:
    """One template as a native program; ``user`` names the caller's buffers in the order
    :meth:`bases` takes their addresses.

    Base indices of operands: ``[0, world)`` the ranks' segments, then the caller's buffers
    (``user``), then from ``remote0`` one slot per (peer, place) for peers' PLACE_CMA
    buffers, which the handshake fills from their descriptors on every call."""

    def __init__(self, tpl, phase_ops, peer_places, *, rank: int, world: int, op,
                 desc_base: int, spin: int):
        prog, lay = tpl.prog, tpl.layout
        n = len(prog.names)
        #: the executor's template and the places this program expects of every rank
        self.template, self.peer_places = tpl, peer_places
        # this rank's PLACE_CMA buffers, as the caller's buffer whose address peers read
        own_cma = {i: underlying(prog, b) for i, b in enumerate(prog.names)
                   if tpl.places[i] == PLACE_CMA}
        self.user = sorted({o.buf for ops in [tpl.pre, tpl.post, *phase_ops] for x in ops
                            for o in (x.dst, *x.srcs) if o.rank is None} | set(own_cma.values()))
        index = {b: world + i for i, b in enumerate(self.user)}
        self.remote0 = world + len(self.user)
        self.n_bases = self.remote0 + world * n

        def base(x: Operand) -> int:
            if x.remote:
                return self.remote0 + x.rank * n + prog.names.index(x.buf)
            return x.rank if x.rank is not None else index[x.buf]
        code: list[int] = []
        #: pc of each wait -> what it awaits (for Python's timeout message)
        self.waits: dict[int, tuple] = {}

        def ops(lst, when=W_ALWAYS):
            for item in lst:
                o, dst2 = (item.op, item.dst2) if isinstance(item, Folded) else (item, None)
                if (len(o.srcs) > 1 or o.first_reduce) and any(x.remote for x in o.srcs):
                    raise ValueError("a peer's PLACE_CMA buffer read into a reduction")
                flags = int(o.first_reduce) | (2 * int(o.completes)) | (4 * (dst2 is not None))
                code.extend((I_OP, when, flags, o.chunk, len(o.srcs)))
                for x in (o.dst, *(() if dst2 is None else (dst2,)), *o.srcs):
                    code.extend((base(x), x.off0, x.step))

        def wait(ranks, when, detail):
            self.waits[len(code)] = (sorted(ranks), detail)
            code.extend((I_WAIT, when, len(ranks), *sorted(ranks)))

        fields = list(tpl.fields)
        code.extend((I_POSTDESC, W_FIRST, len(fields), *fields))
        if own_cma:
            code.extend((I_POSTADDR, W_FIRST, len(own_cma)))
            for i, b in own_cma.items():
                code.extend((D_ADDR + i, index[b]))
        ops(tpl.pre)
        code.extend((I_ADVANCE, W_ALWAYS))
        wait(range(world), W_FIRST, "every rank to arrive")
        expected = [p for r in range(world) for p in peer_places[r][:n]]
        code.extend((I_HANDSHAKE, W_FIRST, len(expected), *expected))
        for i, phase in enumerate(fold_copies(phase_ops, set(own_cma.values()))):
            waits = prog.phases[prog.lead + i].waits
            if waits:
                wait(waits, W_ALWAYS, f"phase {prog.lead + i}")
            ops(phase)
            code.extend((I_ADVANCE, W_ALWAYS))
        ops(tpl.post)
        if prog.end_waits:
            # NOTE [skipping the final wait] (executor.py)
            skip_last = all(tpl.places[i] == PLACE_SCRATCH for i in prog.last_read_bufs)
            wait(prog.end_waits, W_NOT_LAST if skip_last else W_ALWAYS, "readers")
        hdr = [0] * 17
        hdr[H_PIECES], hdr[H_PIECE] = lay.pieces, lay.piece
        hdr[H_DTYPE], hdr[H_ITEMSIZE] = DTYPE_CODES[lay.d.id], lay.d.itemsize
        op = op or ReduceOp.SUM
        hdr[H_OP] = OP_CODES[op]
        hdr[H_SCALE] = world if (op is ReduceOp.AVG and world > 1) else 0
        hdr[H_WORLD], hdr[H_RANK], hdr[H_DESC] = world, rank, desc_base
        hdr[H_DESC_CMP], hdr[H_NPLACES] = D_PLACE, n
        hdr[H_SPIN], hdr[H_BUDGET_NS], hdr[H_LEN] = spin, WAIT_BUDGET_NS, len(code)
        moved = sum(o.chunk for ops in [tpl.pre, tpl.post, *phase_ops] for o in ops)
        hdr[H_NOGIL] = int(moved * lay.d.itemsize > NOGIL_BYTES)
        hdr[H_REMOTE], hdr[H_DESC_ADDR] = self.remote0, D_ADDR
        assert n <= NUM_PLACES
        self.header = np.array(hdr, np.int64)
        self.code = np.array(code, np.int64)
        self.state = np.zeros(S_LEN, np.int64)
        self._state = memoryview(self.state)       # item access without numpy scalars
        self._addr = (self.header.ctypes.data, self.code.ctypes.data, self.state.ctypes.data)

    def bases(self, segs_addr: list[int], buffers: dict) -> tuple[np.ndarray, int]:
        """The base addresses for one call (every rank's segment, then the caller's buffers,
        then room for the peers' PLACE_CMA buffers): the array, to keep alive, and its
        address."""
        arr = np.zeros(self.n_bases, np.int64)
        arr[:self.remote0] = segs_addr + [buffers[b].ctypes.data for b in self.user]
        return arr, arr.ctypes.data

    def run(self, bases: int, seq: int, step: int) -> int:
        """Start the program for call ``seq`` at flag step ``step`` (``seq`` -1: resume where
        it stopped); returns the runner's result code. ``bases``: address from :meth:`bases`."""
        h, c, s = self._addr
        return _native.run(h, c, bases, s, seq, step)

    @property
    def step(self) -> int:
        """The flag step the runner reached."""
        return self._state[S_STEP]

    def pending_wait(self) -> tuple[list[int], str]:
        """The wait the runner stopped at: (ranks, what it awaits)."""
        pc = int(self.state[S_PC])
        ranks, detail = self.waits[pc]
        k = int(self.state[S_K])
        if detail.startswith("phase"):
            detail = f"{detail} of piece {k}"
        elif detail == "readers":
            detail = f"readers of piece {k}"
        return ranks, detail

    def read_error(self) -> tuple[int, int]:
        """The failed single-copy read the runner stopped at: (peer, errno)."""
        return int(self.state[S_PEER]), int(self.state[S_ERRNO])

    def skip_wait(self) -> None:
        """Move past the wait the runner stopped at (Python has finished it)."""
        pc = int(self.state[S_PC])
        self.state[S_PC] = pc + 3 + int(self.code[pc + 2])


__all__ = ["NativeProgram", "enabled"]

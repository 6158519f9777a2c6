"""Schedule: the one definition of a collective algorithm.

A schedule is a list of *phases*; each phase is a set of chunk *moves*. A move is executed by the
rank that owns its destination (pull model: ranks only ever write their own buffers and read their
peers'), so the same object can be

* run by the CPU executor (``backends/cpu.py``) over the shared-memory heap,
* timed by the simulator on a topology (every remote move is a flow ``src_rank -> rank``),
* verified by the checker (``checker.py``) symbolically, and
* implemented by the GPU kernel of the same name.

NOTE [synchronization rule]
    Phases are separated by point-to-point waits derived from the schedule itself, not by global
    barriers. Before phase ``p`` a rank waits for (a) every rank it reads from in phase ``p`` to
    have finished phase ``p - 1`` (read after write), and (b) every rank that read from it in phase
    ``p - 1`` to have finished phase ``p - 1`` (write after read). Before returning it waits for the
    readers of its last phase. The checker proves that, under this rule, no location is read and
    written concurrently, which holds when no phase both writes a location and lets another rank
    read it.

NOTE [reductions]
    Consecutive moves of one rank in a phase that write the same ``dst``, where every move after
    the first reduces, form one *reduction*: ``dst = s_0 (op) s_1 (op) ... (op) s_k`` (or
    ``dst (op)= s_0 ... s_k`` when the first move reduces too). Its sources are all read
    before ``dst`` is written, so a source may be ``dst`` itself (an aliased buffer), and they
    are combined left to right in the listed order: the schedule fixes the reduction order, and
    every engine (CPU executor, GPU kernels, reference interpreter) follows it, accumulating
    16-bit floats in float32 and rounding once when ``dst`` is written.

Buffers are named per collective (``buf`` for in-place collectives; ``in``/``out`` otherwise;
``tmp`` for scratch with the layout of another buffer). Each buffer is split into ``nchunks``
chunks; the collective's layout (``collectives.py``) says how many elements each chunk has.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property


@dataclass(frozen=True)
class Loc:
    """A chunk of a named buffer on the rank that executes the move (or its source)."""

    buf: str
    chunk: int


@dataclass(frozen=True)
class Move:
    """``rank.dst  (+)=  src_rank.src``; executed by ``rank`` (which owns ``dst``).

    ``reduce=False`` copies (overwrites ``dst``); ``reduce=True`` combines with the reduction op.
    """

    rank: int
    dst: Loc
    src_rank: int
    src: Loc
    reduce: bool = False

    @property
    def is_local(self) -> bool:
        return self.src_rank == self.rank


@dataclass(frozen=True)
class Reduction:
    """One rank's fused operation (NOTE [reductions]): ``dst (=|op=) srcs[0] op srcs[1] ...``.

    ``srcs``: ``(src_rank, Loc)`` in combination order. ``accumulate``: ``dst``'s own value is
    the first operand. A single source without ``accumulate`` is a copy.
    """

    dst: Loc
    srcs: tuple[tuple[int, Loc], ...]
    accumulate: bool

    @property
    def is_copy(self) -> bool:
        return len(self.srcs) == 1 and not self.accumulate


def group_moves(moves) -> tuple[Reduction, ...]:
    """One rank's moves of one phase (in order) as reductions (NOTE [reductions])."""
    out: list[Reduction] = []
    for m in moves:
        if out and out[-1].dst == m.dst and m.reduce:
            last = out[-1]
            out[-1] = Reduction(last.dst, last.srcs + ((m.src_rank, m.src),), last.accumulate)
        else:
            out.append(Reduction(m.dst, ((m.src_rank, m.src),), m.reduce))
    return tuple(out)


@dataclass(frozen=True)
class BufferSpec:
    """A buffer of the schedule.

    ``like`` names another buffer whose chunk layout this one copies (scratch such as ``tmp``).
    ``nchunks`` is the number of chunks the buffer is cut into. ``alias``: this scratch buffer
    may share the storage of ``like`` when that buffer is already in symmetric memory (the
    checker proves the schedule correct both ways; moves that become self-copies are skipped).
    """

    name: str
    nchunks: int
    like: str | None = None
    alias: bool = False


@dataclass(frozen=True)
class Schedule:
    """Phases of moves that implement ``collective`` with ``algo`` on ``world_size`` ranks."""

    collective: str
    algo: str
    world_size: int
    buffers: tuple[BufferSpec, ...]
    phases: tuple[tuple[Move, ...], ...]
    root: int = 0
    notes: str = ""
    meta: dict = field(default_factory=dict, compare=False, hash=False)

    def buffer(self, name: str) -> BufferSpec:
        for b in self.buffers:
            if b.name == name:
                return b
        raise KeyError(f"{self.collective}/{self.algo} has no buffer {name!r}")

    def moves_of(self, rank: int, phase: int) -> tuple[Move, ...]:
        return self._by_rank[phase][rank]

    def reductions_of(self, rank: int, phase: int) -> tuple[Reduction, ...]:
        """``rank``'s moves of ``phase`` grouped into reductions (NOTE [reductions])."""
        return group_moves(self._by_rank[phase][rank])

    @cached_property
    def _by_rank(self) -> tuple[tuple[tuple[Move, ...], ...], ...]:
        out = []
        for moves in self.phases:
            per = [[] for _ in range(self.world_size)]
            for m in moves:
                per[m.rank].append(m)
            out.append(tuple(tuple(p) for p in per))
        return tuple(out)

    @cached_property
    def sources(self) -> tuple[tuple[frozenset[int], ...], ...]:
        """``sources[p][r]``: peers that rank ``r`` reads from in phase ``p``."""
        return tuple(
            tuple(frozenset(m.src_rank for m in self._by_rank[p][r] if not m.is_local)
                  for r in range(self.world_size))
            for p in range(len(self.phases)))

    @cached_property
    def readers(self) -> tuple[tuple[frozenset[int], ...], ...]:
        """``readers[p][r]``: peers that read from rank ``r`` in phase ``p``."""
        out = []
        for moves in self.phases:
            per = [set() for _ in range(self.world_size)]
            for m in moves:
                if not m.is_local:
                    per[m.src_rank].add(m.rank)
            out.append(tuple(frozenset(s) for s in per))
        return tuple(out)

    def waits_before(self, rank: int, phase: int) -> frozenset[int]:
        """Ranks whose completion of ``phase - 1`` ``rank`` must see before starting ``phase``."""
        w = set(self.sources[phase][rank])
        if phase > 0:
            w |= self.readers[phase - 1][rank]
        return frozenset(w)

    def waits_at_end(self, rank: int) -> frozenset[int]:
        """Ranks whose completion of the last phase ``rank`` must see before returning."""
        return self.readers[-1][rank] if self.phases else frozenset()

    @cached_property
    def leading_local_phases(self) -> int:
        """Number of leading phases in which no rank reads a peer (run before the handshake)."""
        n = 0
        for moves in self.phases:
            if any(not m.is_local for m in moves):
                break
            n += 1
        return n

    def aliased(self) -> "Schedule":
        """The schedule with every ``alias`` buffer folded into the buffer it is like."""
        sub = {b.name: b.like for b in self.buffers if b.alias}
        if not sub:
            return self

        def fold(loc: Loc) -> Loc:
            return Loc(sub.get(loc.buf, loc.buf), loc.chunk)

        phases = []
        for ph in self.phases:
            moves = []
            for m in ph:
                m2 = Move(m.rank, fold(m.dst), m.src_rank, fold(m.src), m.reduce)
                if not (m2.is_local and m2.dst == m2.src and not m2.reduce):
                    moves.append(m2)
            phases.append(tuple(moves))
        return Schedule(self.collective, self.algo, self.world_size,
                        tuple(b for b in self.buffers if not b.alias),
                        tuple(p for p in phases if p), self.root, self.notes, self.meta)

    def remote_read_buffers(self) -> frozenset[str]:
        """Buffers some peer reads: these must live in symmetric memory."""
        return frozenset(m.src.buf for ph in self.phases for m in ph if not m.is_local)

    def num_remote_moves(self) -> int:
        return sum(1 for ph in self.phases for m in ph if not m.is_local)

"""Where the CPU executor puts a call's buffers, and its compiled form of a plan: one pure
module (plans in, places out; nothing of the runtime) that the executor
(``backends/cpu/executor.py``) and the CPU cost model (``sim/cpu_loop.py``, which imports no
backend) both import, so the model counts the copies the executor makes and cannot drift
from it.

A :class:`~tilecomm.algorithms.lower.RankPlan` is what every engine reads. The executor also
needs, per plan: which buffers peers read (they must be in symmetric memory), where each one's
chunks sit in scratch, which of its buffers peers read in the last phase (NOTE [skipping the
final wait] in executor.py), which of its chunks some peer reads, and which buffers some rank
reads into a reduction. :func:`cpu_plan` computes that once per plan (:class:`CpuPlan`).

:func:`place` is the placement policy of one buffer (NOTE [placement]).
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from functools import lru_cache

from .lower import USER_BUFFERS, RankPlan, lower
from .schedule import Schedule

#: calls moving up to this many bytes (all their buffers together) keep ready-made callables
#: in the executor (no plan work per call); the CPU cost model counts with it too
SMALL_CALL_BYTES = 1 << 20

#: places a buffer can have (:func:`place`)
HEAP, CMA, LOCAL, SCRATCH = "heap", "cma", "local", "scratch"


@dataclass(frozen=True)
class CpuPlan(RankPlan):
    """A rank's plan with what the CPU executor adds to it (see the module docstring)."""

    #: buffers peers read, or scratch like another one (they live in symmetric memory)
    symmetric: tuple[str, ...] = ()
    #: symmetric buffer -> its first chunk's slot in scratch
    slot_base: dict = field(default_factory=dict)
    #: chunks of all symmetric buffers together
    nslots: int = 0
    #: indices (in ``names``) of this rank's buffers peers read in the last phase
    last_read_bufs: tuple[int, ...] = ()
    #: buffer -> frozenset of this rank's chunks some peer reads
    peer_read: dict = field(default_factory=dict)
    #: buffers some rank reads from a peer into a reduction (on any rank: all place alike)
    peer_reduced: frozenset = frozenset()


@lru_cache(maxsize=1024)
def cpu_plan(collective: str, algo: str, world_size: int, root: int, rank: int) -> CpuPlan:
    """The executor's plan of ``rank`` for the registered schedule ``collective/algo``."""
    return compile_plan(lower(collective, algo, world_size, root, rank))


def compile_plan(plan: RankPlan) -> CpuPlan:
    """``plan`` with the executor's fields (any checked schedule's plan)."""
    sched, rank = plan.sched, plan.rank
    remote = sched.remote_read_buffers()
    names = plan.names
    symmetric = tuple(b for b in names if sched.buffer(b).like is not None or b in remote)
    base, slot = {}, 0
    for b in symmetric:
        base[b] = slot
        slot += sched.buffer(b).nchunks
    last = {m.src.buf for m in (sched.phases[-1] if sched.phases else ())
            if m.src_rank == rank and m.rank != rank}
    read: dict[str, set[int]] = {}
    for ph in sched.phases:
        for m in ph:
            if m.src_rank == rank and m.rank != rank:
                read.setdefault(m.src.buf, set()).add(m.src.chunk)
    return CpuPlan(**{f.name: getattr(plan, f.name) for f in fields(RankPlan)},
                   symmetric=symmetric, slot_base=base, nslots=slot,
                   last_read_bufs=tuple(names.index(b) for b in sorted(last)),
                   peer_read={b: frozenset(c) for b, c in read.items()},
                   peer_reduced=peer_reduced(sched))


def peer_reduced(sched: Schedule) -> frozenset:
    """Buffers that some rank reads from a peer as an operand of a reduction (rather than
    only copying them); computed once per schedule object."""
    d = sched.__dict__.setdefault("_placement", {})
    if "peer_reduced" not in d:
        d["peer_reduced"] = frozenset(
            loc.buf for p in range(len(sched.phases)) for r in range(sched.world_size)
            for red in sched.reductions_of(r, p) if len(red.srcs) > 1 or red.accumulate
            for sr, loc in red.srcs if sr != r)
    return d["peer_reduced"]


# NOTE [placement]: a buffer the caller passes lives in its own memory. If that memory is the
# symmetric heap, peers read it there (HEAP). If no peer reads it, it stays there (LOCAL). If
# peers read it and single-copy reads are on for the call, they read it in place with
# process_vm_readv (CMA) -- but only what they copy: a reduction operand read through the
# kernel into a bounce buffer measured slower than staging it (docs/benchmarks.md). Anything
# else is staged through this rank's scratch (SCRATCH). A scratch buffer marked ``alias``
# shares the storage of the caller's buffer it is ``like`` when that one is on the heap (or,
# with single-copy reads, readable in place); other scratch is scratch.
def place(plan: CpuPlan, buf: str, *, in_heap: bool, single_copy: bool, present: bool = True
          ) -> str:
    """Where ``buf`` of ``plan`` lives for a call (NOTE [placement]). ``in_heap``: the
    caller's buffer (for an ``alias`` scratch buffer: the buffer it is like) is in the
    symmetric heap; ``present``: that buffer was passed; ``single_copy``: the call lets peers
    read the caller's memory in place (:func:`single_copy`)."""
    if buf not in USER_BUFFERS:
        if not plan.sched.buffer(buf).alias or not present:
            return SCRATCH
        if in_heap:
            return HEAP
        return CMA if single_copy and present and buf not in plan.peer_reduced else SCRATCH
    if in_heap:
        return HEAP
    if buf not in plan.symmetric:
        return LOCAL
    return CMA if single_copy and present and buf not in plan.peer_reduced else SCRATCH


def single_copy(total_bytes: int, *, enabled: bool, min_bytes: int) -> bool:
    """Whether a call of ``total_bytes`` (all its buffers together) lets peers read the
    caller's tensors in place: every rank could read every peer (``enabled``), and the call
    is large enough for the system call and the page pinning to cost less than staging."""
    return enabled and total_bytes >= min_bytes

"""Direct algorithms: every rank reads what it needs straight from every peer, in one phase.

On a full mesh (shared memory, NVSwitch) this is one synchronization and the minimum bytes moved;
on a ring or tree fabric it oversubscribes links (the simulator shows by how much).
"""

from __future__ import annotations

from .registry import register
from .schedule import BufferSpec, Loc, Move, Schedule


@register("all_gather", "direct")
def direct_all_gather(world_size: int, root: int = 0) -> Schedule:
    """``out_r[j] = in_j`` for every j."""
    w = world_size
    moves = tuple(Move(r, Loc("out", j), j, Loc("in", 0)) for r in range(w) for j in range(w))
    return Schedule("all_gather", "direct", w, (BufferSpec("in", 1), BufferSpec("out", w)),
                    (moves,))


@register("reduce_scatter", "direct")
def direct_reduce_scatter(world_size: int, root: int = 0) -> Schedule:
    """``out_r = in_0[r] + in_1[r] + ... + in_{W-1}[r]``."""
    w = world_size
    moves = tuple(Move(r, Loc("out", 0), j, Loc("in", r), reduce=j > 0)
                  for r in range(w) for j in range(w))
    return Schedule("reduce_scatter", "direct", w, (BufferSpec("in", w), BufferSpec("out", 1)),
                    (moves,))


@register("broadcast", "direct")
def direct_broadcast(world_size: int, root: int = 0) -> Schedule:
    """Every non-root rank copies the root's buffer."""
    moves = tuple(Move(r, Loc("buf", 0), root, Loc("buf", 0))
                  for r in range(world_size) if r != root)
    return Schedule("broadcast", "direct", world_size, (BufferSpec("buf", 1),),
                    (moves,) if moves else (), root=root)


@register("reduce", "direct")
def direct_reduce(world_size: int, root: int = 0) -> Schedule:
    """The root sums every rank's buffer, its own included, in rank order 0..W-1 (one
    reduction that reads its own buffer before writing it: NOTE [reductions] in schedule.py),
    so the root gets the bits of the rank-order reference."""
    w = world_size
    moves = tuple(Move(root, Loc("buf", 0), j, Loc("buf", 0), reduce=j > 0) for j in range(w)) \
        if w > 1 else ()
    return Schedule("reduce", "direct", w, (BufferSpec("buf", 1),),
                    (moves,) if moves else (), root=root)


@register("barrier", "direct")
def direct_barrier(world_size: int, root: int = 0) -> Schedule:
    """No data: the entry handshake (every rank sees every rank arrive) is the barrier."""
    return Schedule("barrier", "direct", world_size, (), ())

"""Binomial trees for broadcast and reduce (``vr = (r - root) mod W`` is the rank in the tree).

broadcast, phase k = 0..ceil(log2 W)-1::

    ranks with 2^k <= vr < 2^(k+1) copy buf from vr - 2^k

reduce, phase k (children first)::

    ranks with vr % 2^(k+1) == 0 add the partial of vr + 2^k

Non-root ranks accumulate in ``tmp`` so their input buffer is left as it was; the root
accumulates in ``buf``. ``ceil(log2 W)`` steps: the latency choice for rooted collectives.
"""

from __future__ import annotations

from .registry import register
from .schedule import BufferSpec, Loc, Move, Schedule


def _levels(w: int) -> int:
    return max(0, (w - 1).bit_length())


@register("broadcast", "tree")
def tree_broadcast(world_size: int, root: int = 0) -> Schedule:
    w = world_size
    phases = []
    for k in range(_levels(w)):
        moves = []
        for vr in range(1 << k, min(1 << (k + 1), w)):
            r, parent = (vr + root) % w, (vr - (1 << k) + root) % w
            moves.append(Move(r, Loc("buf", 0), parent, Loc("buf", 0)))
        phases.append(tuple(moves))
    return Schedule("broadcast", "tree", w, (BufferSpec("buf", 1),), tuple(phases), root=root)


@register("reduce", "tree")
def tree_reduce(world_size: int, root: int = 0) -> Schedule:
    w = world_size
    has_children = [vr % 2 == 0 and vr + 1 < w for vr in range(w)]
    # A non-root inner node keeps its partial in tmp; leaves are read straight from buf.
    stage = tuple(Move((vr + root) % w, Loc("tmp", 0), (vr + root) % w, Loc("buf", 0))
                  for vr in range(1, w) if has_children[vr])
    phases = [stage] if stage else []
    for k in range(_levels(w)):
        moves = []
        for vr in range(0, w, 1 << (k + 1)):
            child = vr + (1 << k)
            if child >= w:
                continue
            r, c = (vr + root) % w, (child + root) % w
            child_has_children = child % 2 == 0 and child + 1 < w
            src = Loc("tmp", 0) if child_has_children else Loc("buf", 0)
            dst = Loc("buf", 0) if vr == 0 else Loc("tmp", 0)
            moves.append(Move(r, dst, c, src, reduce=True))
        phases.append(tuple(moves))
    return Schedule("reduce", "tree", w, (BufferSpec("buf", 1), BufferSpec("tmp", 1, like="buf")),
                    tuple(phases), root=root)

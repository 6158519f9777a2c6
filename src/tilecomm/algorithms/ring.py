"""Ring algorithms: each rank only ever reads its left neighbour ``r - 1``.

all_reduce (``buf`` cut into W chunks)::

    reduce-scatter step s = 0..W-2:  buf_r[c] += buf_{r-1}[c],  c = r - 1 - s  (mod W)
    all-gather     step s = 0..W-2:  buf_r[c]  = buf_{r-1}[c],  c = r - s      (mod W)

After the reduce-scatter, rank r holds the full sum of chunk r + 1; the all-gather passes the
finished chunks around. ``2 (W - 1)`` steps, each moving ``1 / W`` of the message over one link:
bandwidth-optimal on any topology that embeds a ring, latency linear in W.
"""

from __future__ import annotations

from .registry import register
from .schedule import BufferSpec, Loc, Move, Schedule


@register("all_reduce", "ring")
def ring_all_reduce(world_size: int, root: int = 0) -> Schedule:
    w = world_size
    phases = []
    for s in range(w - 1):
        phases.append(tuple(Move(r, Loc("buf", (r - 1 - s) % w), (r - 1) % w,
                                 Loc("buf", (r - 1 - s) % w), reduce=True) for r in range(w)))
    for s in range(w - 1):
        phases.append(tuple(Move(r, Loc("buf", (r - s) % w), (r - 1) % w,
                                 Loc("buf", (r - s) % w)) for r in range(w)))
    return Schedule("all_reduce", "ring", w, (BufferSpec("buf", w),), tuple(phases))


@register("all_gather", "ring")
def ring_all_gather(world_size: int, root: int = 0) -> Schedule:
    """``out_r[r] = in_r``, then step s copies chunk ``r - 1 - s`` from the left neighbour."""
    w = world_size
    phases = [tuple(Move(r, Loc("out", r), r, Loc("in", 0)) for r in range(w))]
    for s in range(w - 1):
        phases.append(tuple(Move(r, Loc("out", (r - 1 - s) % w), (r - 1) % w,
                                 Loc("out", (r - 1 - s) % w)) for r in range(w)))
    return Schedule("all_gather", "ring", w, (BufferSpec("in", 1), BufferSpec("out", w)),
                    tuple(phases))


@register("reduce_scatter", "ring")
def ring_reduce_scatter(world_size: int, root: int = 0) -> Schedule:
    """Step s: ``tmp_r[c] = in_r[c] + (left's partial of c)``, ``c = r - 2 - s``; the last step
    lands chunk ``r`` in ``out``. Inputs are never written."""
    w = world_size
    if w == 1:
        phases = [(Move(0, Loc("out", 0), 0, Loc("in", 0)),)]
    else:
        phases = []
        for s in range(w - 1):
            step = []
            for r in range(w):
                c = (r - 2 - s) % w
                dst = Loc("out", 0) if s == w - 2 else Loc("tmp", c)
                left = Loc("in", c) if s == 0 else Loc("tmp", c)
                step.append(Move(r, dst, r, Loc("in", c)))
                step.append(Move(r, dst, (r - 1) % w, left, reduce=True))
            phases.append(tuple(step))
    return Schedule("reduce_scatter", "ring", w,
                    (BufferSpec("in", w), BufferSpec("out", 1), BufferSpec("tmp", w, like="in")),
                    tuple(phases))

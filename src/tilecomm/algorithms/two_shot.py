"""two_shot all_reduce: a direct reduce-scatter, then a direct all-gather.

::

    buf and tmp are cut into W chunks; rank r owns chunk r.
    phase 0 (local)           tmp_r[c]  = buf_r[c]   for every c != r (what peers will read)
    phase 1 (reduce-scatter)  tmp_r[r]  = x_0[r] + x_1[r] + ... + x_{W-1}[r]   (rank order)
                              where x_j = tmp_j for j != r and x_r = buf_r
    phase 2 (all-gather)      buf_r[j]  = tmp_j[j]   for every j

Each rank reads ``2 (W - 1) / W`` of the message: the bandwidth choice on a full-mesh fabric
(shared memory, NVSwitch). Each chunk is reduced by its owner only, so all ranks end bit-identical.
``tmp`` may alias ``buf``: for a tensor in symmetric memory the staging copy disappears and the
algorithm runs in place (the reduction then reads ``buf_r[r]`` as one of its sources and writes
it: NOTE [reductions] in ``schedule.py``); for any other tensor only ``tmp`` lives in shared
memory and the all-gather writes straight into the caller's tensor. Summing in rank order gives
the bits of the rank-order reference, so two_shot serves the deterministic mode.
"""

from __future__ import annotations

from .registry import register
from .schedule import BufferSpec, Loc, Move, Schedule


@register("all_reduce", "two_shot")
def two_shot_all_reduce(world_size: int, root: int = 0) -> Schedule:
    w = world_size
    stage = tuple(Move(r, Loc("tmp", c), r, Loc("buf", c))
                  for r in range(w) for c in range(w) if c != r)
    # The owner's own chunk is read from buf directly: staging it would be a wasted copy.
    rs = tuple(Move(r, Loc("tmp", r), j, Loc("buf" if j == r else "tmp", r), reduce=j > 0)
               for r in range(w) for j in range(w))
    ag = tuple(Move(r, Loc("buf", j), j, Loc("tmp", j)) for r in range(w) for j in range(w))
    phases = tuple(p for p in (stage, rs, ag) if p)
    return Schedule("all_reduce", "two_shot", w,
                    (BufferSpec("buf", w), BufferSpec("tmp", w, like="buf", alias=True)), phases)

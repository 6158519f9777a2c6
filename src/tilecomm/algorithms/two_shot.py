"""two_shot all_reduce: a direct reduce-scatter, then a direct all-gather, in place.

::

    buf is cut into W chunks; rank r owns chunk r.
    phase 0 (reduce-scatter)  buf_r[r] += buf_j[r]   for j = r+1, r+2, ... (mod W)
    phase 1 (all-gather)      buf_r[j]  = buf_j[j]   for j != r

Each rank reads ``2 (W - 1) / W`` of the message: the bandwidth choice on a full-mesh fabric
(shared memory, NVSwitch). Each chunk is reduced by its owner only, so all ranks end bit-identical.
"""

from __future__ import annotations

from .registry import register
from .schedule import BufferSpec, Loc, Move, Schedule


@register("all_reduce", "two_shot")
def two_shot_all_reduce(world_size: int, root: int = 0) -> Schedule:
    w = world_size
    rs = tuple(Move(r, Loc("buf", r), (r + k) % w, Loc("buf", r), reduce=True)
               for r in range(w) for k in range(1, w))
    ag = tuple(Move(r, Loc("buf", j), j, Loc("buf", j))
               for r in range(w) for j in range(w) if j != r)
    phases = tuple(p for p in (rs, ag) if p)
    return Schedule("all_reduce", "two_shot", w, (BufferSpec("buf", w),), phases)

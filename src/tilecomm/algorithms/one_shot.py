"""one_shot all_reduce: every rank stages its input, then reads all peers' copies and reduces.

::

    phase 0 (local)   tmp_r    = buf_r
    phase 1           buf_r    = tmp_0 + tmp_1 + ... + tmp_{W-1}      (same order on every rank,
                                                                     so every rank gets the same bits)

One synchronization and ``W - 1`` remote reads of the whole message per rank: the latency choice.
"""

from __future__ import annotations

from .registry import register
from .schedule import BufferSpec, Loc, Move, Schedule


@register("all_reduce", "one_shot")
def one_shot_all_reduce(world_size: int, root: int = 0) -> Schedule:
    w = world_size
    buf, tmp = Loc("buf", 0), Loc("tmp", 0)
    stage = tuple(Move(r, tmp, r, buf) for r in range(w))
    reduce = tuple(Move(r, buf, j, tmp, reduce=j > 0) for r in range(w) for j in range(w))
    return Schedule("all_reduce", "one_shot", w,
                    (BufferSpec("buf", 1), BufferSpec("tmp", 1, like="buf")),
                    (stage, reduce))

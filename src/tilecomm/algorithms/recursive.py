"""Recursive doubling all_reduce: ``log2 W`` exchange steps between partners ``r xor 2^k``.

For a power-of-two W, step k combines each rank's partial with its partner's. Ranks read the
partner's previous partial while writing their own, so partials alternate between ``buf`` and
``tmp`` (a rank never writes what its partner reads in the same phase). With ``P`` the largest
power of two <= W, the ``W - P`` extra ranks first fold into ranks ``0..W-P-1`` and copy the result
back at the end::

    fold        buf_r += buf_{r+P}                       r < W - P
    step k      x_r = y_r + y_{r xor 2^k}                (y, x) alternate (buf, tmp)
    unfold      buf_{r} = buf_{r-P}                      r >= P

Partners add the same two values in swapped order, and IEEE addition is commutative, so every
rank ends with the same bits. ``log2 W`` steps each moving the whole message: a latency choice.
"""

from __future__ import annotations

from .registry import register
from .schedule import BufferSpec, Loc, Move, Schedule


@register("all_reduce", "recursive_doubling")
def recursive_doubling_all_reduce(world_size: int, root: int = 0) -> Schedule:
    w = world_size
    p = 1 << (w.bit_length() - 1)
    extra = w - p
    buf, tmp = Loc("buf", 0), Loc("tmp", 0)
    phases = []
    if extra:
        phases.append(tuple(Move(r, buf, r + p, buf, reduce=True) for r in range(extra)))
    cur, nxt = buf, tmp
    for k in range((p - 1).bit_length()):
        moves = []
        for r in range(p):
            partner = r ^ (1 << k)
            moves.append(Move(r, nxt, r, cur))
            moves.append(Move(r, nxt, partner, cur, reduce=True))
        phases.append(tuple(moves))
        cur, nxt = nxt, cur
    if cur != buf:
        phases.append(tuple(Move(r, buf, r, tmp) for r in range(p)))
    if extra:
        phases.append(tuple(Move(r, buf, r - p, buf) for r in range(p, w)))
    return Schedule("all_reduce", "recursive_doubling", w,
                    (BufferSpec("buf", 1), BufferSpec("tmp", 1, like="buf")), tuple(phases))

"""rhd all_reduce (Rabenseifner): recursive halving reduce-scatter, recursive doubling all-gather.

With ``P`` the largest power of two <= W, ``buf`` is cut into ``P`` chunks. Among ranks
``0..P-1``, reduce-scatter step k (partner ``r xor d``, ``d = P / 2^(k+1)``) halves the block a
rank is responsible for: it keeps the half named by bit ``d`` of its rank and adds the
partner's partials of that half; after ``log2 P`` steps rank r holds the full sum of chunk r.
The all-gather mirrors it (``d = 1, 2, ..., P/2``), copying the partner's finished block. The
``W - P`` extra ranks fold into ranks ``0..W-P-1`` first and copy the result back at the end::

    fold        buf_r += buf_{r+P}                              r < W - P
    halving k   buf_r[c] += buf_{r xor d}[c]   c in the half r keeps     r < P
    doubling k  buf_r[c]  = buf_{r xor d}[c]   c in the block the partner holds
    unfold      buf_r = buf_{r-P}                               r >= P

In every step a rank writes only chunks its partner does not read in that step (the partner
reads the other half / the rank's own block), so it runs in place with no scratch. Each chunk
is reduced by one rank, then copied, so every rank ends with the same bits; the order of the
partial sums is not rank order (chunk 0 on 4 ranks is ``(x0 + x2) + (x1 + x3)``), which
``lower.rank_ordered`` derives, so deterministic mode refuses rhd.

Each rank moves ``2 (P - 1) / P`` of the message in ``2 log2 P`` steps (plus the whole message
twice on a non-power-of-two world): ring's bandwidth at recursive doubling's step count.
"""

from __future__ import annotations

from .registry import register
from .schedule import BufferSpec, Loc, Move, Schedule


def _kept_block(rank: int, d: int, p: int) -> range:
    """Chunks ``rank`` is responsible for once the steps of distance >= ``d`` are done: the
    ``d`` chunks whose index agrees with ``rank`` above bit ``d`` (halving ends at ``d = 1``
    with chunk ``rank`` alone; doubling starts from there)."""
    lo = rank & ~(d - 1) & (p - 1)
    return range(lo, lo + d)


@register("all_reduce", "rhd")
def rhd_all_reduce(world_size: int, root: int = 0) -> Schedule:
    w = world_size
    p = 1 << (w.bit_length() - 1)
    extra = w - p

    def buf(c: int) -> Loc:
        return Loc("buf", c)

    phases = []
    if extra:
        phases.append(tuple(Move(r, buf(c), r + p, buf(c), reduce=True)
                            for r in range(extra) for c in range(p)))
    dists = [p >> (k + 1) for k in range((p - 1).bit_length())]   # P/2, P/4, ..., 1
    for d in dists:                     # halving: keep the half of the block bit d names
        phases.append(tuple(Move(r, buf(c), r ^ d, buf(c), reduce=True)
                            for r in range(p) for c in _kept_block(r, d, p)))
    for d in reversed(dists):           # doubling: fetch the partner's finished block
        phases.append(tuple(Move(r, buf(c), r ^ d, buf(c))
                            for r in range(p) for c in _kept_block(r ^ d, d, p)))
    if extra:
        phases.append(tuple(Move(r, buf(c), r - p, buf(c))
                            for r in range(p, w) for c in range(p)))
    return Schedule("all_reduce", "rhd", w, (BufferSpec("buf", p),), tuple(phases))

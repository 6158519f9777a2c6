"""Pairwise all-to-all: in step s, rank r receives from ``r - s`` (and is read by ``r + s``).

::

    phase 0 (local)  out_r[r] = in_r[r]
    phase s          out_r[p] = in_p[r],   p = r - s (mod W),  s = 1..W-1

Every step is a perfect matching, so no link or memory port carries two flows at once. The same
schedule serves all_to_all_v, whose chunk lengths come from the exchanged count matrix.
"""

from __future__ import annotations

from .registry import register
from .schedule import BufferSpec, Loc, Move, Schedule


def _pairwise(collective: str, w: int) -> Schedule:
    phases = [tuple(Move(r, Loc("out", r), r, Loc("in", r)) for r in range(w))]
    for s in range(1, w):
        phases.append(tuple(Move(r, Loc("out", (r - s) % w), (r - s) % w, Loc("in", r))
                            for r in range(w)))
    return Schedule(collective, "pairwise", w, (BufferSpec("in", w), BufferSpec("out", w)),
                    tuple(phases))


def _direct(collective: str, w: int) -> Schedule:
    moves = tuple(Move(r, Loc("out", j), j, Loc("in", r)) for r in range(w) for j in range(w))
    return Schedule(collective, "direct", w, (BufferSpec("in", w), BufferSpec("out", w)),
                    (moves,))


@register("all_to_all", "pairwise")
def pairwise_all_to_all(world_size: int, root: int = 0) -> Schedule:
    return _pairwise("all_to_all", world_size)


@register("all_to_all_v", "pairwise")
def pairwise_all_to_all_v(world_size: int, root: int = 0) -> Schedule:
    return _pairwise("all_to_all_v", world_size)


@register("all_to_all", "direct")
def direct_all_to_all(world_size: int, root: int = 0) -> Schedule:
    """One phase: every rank pulls its chunk from every peer at once."""
    return _direct("all_to_all", world_size)


@register("all_to_all_v", "direct")
def direct_all_to_all_v(world_size: int, root: int = 0) -> Schedule:
    return _direct("all_to_all_v", world_size)

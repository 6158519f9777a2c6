"""Resolves ``algo="auto"``: the candidate with the lowest predicted time.

The candidates are what the backend offers for the call (``Backend.algorithms``: the registered
schedules on one host, the hierarchical algorithms and ``engine`` across hosts), already
narrowed by deterministic mode; the costs are :func:`tilecomm.tuning.current` (this machine's
``tilecomm tune`` file, or the shipped defaults). NOTE [auto by predicted cost] in
``tuning/costs.py`` says how each backend kind is predicted and how ties break.
"""

from __future__ import annotations

from .algorithms.registry import algorithms as registered
from .tuning import Choice, CostModel, current


def decide(collective: str, nbytes: int, world_size: int, *, kind: str = "cpu",
           available: list[str] | None = None, mem: str = "user", layout=None,
           root: int = 0, model: CostModel | None = None) -> Choice:
    """What ``auto`` runs for a call of ``nbytes`` (the bench's size: all_gather's output,
    the input otherwise) and why. ``available``: the backend's candidates (default: every
    registered algorithm of ``collective``)."""
    cands = list(registered(collective) if available is None else available)
    if not cands:
        raise ValueError(f"{collective}: this backend has no algorithm for it")
    if world_size <= 1:         # nothing to exchange: the first candidate, no prediction
        return Choice(cands[0], ((cands[0], 0.0),), "one rank")
    if kind == "hier" and layout is None:
        raise ValueError("kind='hier' needs the host layout")
    return (model or current()).choose(collective, nbytes, world_size, cands, kind=kind,
                                       mem=mem, layout=layout, root=root)


def choose(collective: str, nbytes: int, world_size: int, *, kind: str = "cpu",
           available: list[str] | None = None, mem: str = "user", layout=None,
           root: int = 0, model: CostModel | None = None) -> str:
    """The algorithm :func:`decide` picks."""
    return decide(collective, nbytes, world_size, kind=kind, available=available, mem=mem,
                  layout=layout, root=root, model=model).algo

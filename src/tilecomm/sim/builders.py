"""Model-side schedules as :class:`FlowSchedule` s, built with numpy (no per-move objects).

The ``ring`` and ``rhd`` builders are fast paths of registered schedules: they reproduce the
traffic of ``get_schedule(..., "ring" | "rhd", W)`` exactly (tested) and scale to any world size
without materializing moves. The others are what-ifs, algorithms the runtime does not run
(``tilecomm sim --what-if`` shows them, labelled so):

* ``hierarchical`` all_reduce: ring reduce-scatter inside each node, ring all_reduce across nodes
  between ranks of the same local index (one ring per rail), ring all-gather inside each node.
  The runtime's ``hier_rail`` has this structure but runs its legs as direct exchanges
  (``hier/plans.py``), which the simulator times from the plans themselves.
* ``bruck`` all_to_all: ``ceil(log2 W)`` steps, step k sends the blocks whose index has bit k set
  to rank ``r + 2^k`` (Bruck et al., 1997), plus the local rotations before and after.
* ``pairwise`` send_recv: every rank sends its buffer to ``r + 1`` (nccl-tests sendrecv).
"""

from __future__ import annotations

import numpy as np

from .flowsched import FlowPhase, FlowSchedule


def _phase(dst, src, frac, reduce, repeat=1) -> FlowPhase:
    n = len(dst)
    return FlowPhase(dst, src, np.broadcast_to(np.asarray(frac, float), n).copy(),
                     np.broadcast_to(np.asarray(reduce, bool), n).copy(), repeat)


def ring(collective: str, w: int) -> FlowSchedule:
    """Ring all_reduce / all_gather / reduce_scatter on ranks 0..w-1 (each reads ``r - 1``)."""
    r = np.arange(w)
    left = (r - 1) % w
    phases = []
    if collective == "all_reduce":
        phases = [_phase(r, left, 1 / w, True, w - 1), _phase(r, left, 1 / w, False, w - 1)]
    elif collective == "all_gather":
        phases = [_phase(r, r, 1 / w, False), _phase(r, left, 1 / w, False, w - 1)]
    elif collective == "reduce_scatter":
        phases = [_phase(np.repeat(r, 2), np.stack([r, left], 1).ravel(), 1 / w,
                         np.tile([False, True], w), w - 1)]
    else:
        raise ValueError(f"no ring for {collective}")
    return FlowSchedule(collective, "ring", w, [p for p in phases if p.repeat > 0])


def hierarchical(collective: str, nodes: int, gpus: int) -> FlowSchedule:
    """Intra-node ring reduce-scatter, inter-node ring all_reduce per local index, intra all-gather."""
    if collective != "all_reduce":
        raise ValueError("hierarchical is modeled for all_reduce")
    w = nodes * gpus
    r = np.arange(w)
    node, loc = r // gpus, r % gpus
    intra_left = node * gpus + (loc - 1) % gpus
    inter_left = ((node - 1) % nodes) * gpus + loc
    phases = []
    if gpus > 1:
        phases.append(_phase(r, intra_left, 1 / gpus, True, gpus - 1))
    if nodes > 1:
        f = 1 / (gpus * nodes)
        phases += [_phase(r, inter_left, f, True, nodes - 1),
                   _phase(r, inter_left, f, False, nodes - 1)]
    if gpus > 1:
        phases.append(_phase(r, intra_left, 1 / gpus, False, gpus - 1))
    return FlowSchedule(collective, "hierarchical", w, phases,
                        notes="intra ring RS -> inter ring AR per rail -> intra ring AG")


def rhd(collective: str, w: int) -> FlowSchedule:
    """The registered ``rhd`` all_reduce (``algorithms/rhd.py``) as flows: the ``W - P``
    extra ranks fold into ranks ``0..W-P-1`` (whole buffer), recursive halving then doubling
    among ``P`` (step at distance d moves ``d / P`` of the message), the extras copy back."""
    if collective != "all_reduce":
        raise ValueError("rhd is an all_reduce")
    p = 1 << (w.bit_length() - 1)
    r = np.arange(p)
    extra = np.arange(w - p)
    phases = []
    if len(extra):
        phases.append(_phase(extra, extra + p, 1.0, True))
    dists = [p >> (k + 1) for k in range((p - 1).bit_length())]
    phases += [_phase(r, r ^ d, d / p, True) for d in dists]            # halving
    phases += [_phase(r, r ^ d, d / p, False) for d in reversed(dists)]  # doubling
    if len(extra):
        phases.append(_phase(extra + p, extra, 1.0, False))
    return FlowSchedule(collective, "rhd", w, phases)


def bruck(collective: str, w: int) -> FlowSchedule:
    if collective not in ("all_to_all",):
        raise ValueError("bruck models all_to_all")
    r = np.arange(w)
    idx = np.arange(w)
    phases = [_phase(r, r, 1.0, False)]
    k = 0
    while (1 << k) < w:
        frac = np.count_nonzero(idx & (1 << k)) / w
        phases.append(_phase(r, (r - (1 << k)) % w, frac, False))
        k += 1
    phases.append(_phase(r, r, 1.0, False))
    return FlowSchedule(collective, "bruck", w, phases)


def send_recv(w: int) -> FlowSchedule:
    r = np.arange(w)
    return FlowSchedule("send_recv", "pairwise", w, [_phase(r, (r - 1) % w, 1.0, False)])

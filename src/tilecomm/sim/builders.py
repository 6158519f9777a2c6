"""Model-side schedules as :class:`FlowSchedule` s, built with numpy (no per-move objects).

The ring builders reproduce the registered ``ring`` schedules' traffic exactly (tested) and scale
to any world size. The others are topology-aware algorithms the runtime does not run yet:

* ``hierarchical`` all_reduce: ring reduce-scatter inside each node, ring all_reduce across nodes
  between ranks of the same local index (one ring per rail), ring all-gather inside each node.
* ``rhd`` all_reduce: recursive halving reduce-scatter, then recursive doubling all-gather
  (Rabenseifner; power-of-two world sizes).
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
    if collective != "all_reduce" or w & (w - 1):
        raise ValueError("rhd models all_reduce on a power-of-two world size")
    r = np.arange(w)
    phases = []
    steps = w.bit_length() - 1
    for k in range(steps):                       # halving: distance w/2, w/4, ...; data halves
        phases.append(_phase(r, r ^ (w >> (k + 1)), 1 / (2 << k), True))
    for k in reversed(range(steps)):             # doubling: mirror image
        phases.append(_phase(r, r ^ (w >> (k + 1)), 1 / (2 << k), False))
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

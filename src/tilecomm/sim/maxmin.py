"""Max-min fair rates of concurrent flows over shared links (progressive filling, vectorized).

Every unfrozen flow's rate rises together; when a link saturates (or a flow hits its own cap),
the flows through it freeze at the current level and the rest keep rising. The result is the
unique max-min fair allocation. Cost: O(levels x entries) numpy work, where ``entries`` is the
number of (flow, link) pairs and ``levels`` the number of distinct bottleneck rates (small in
practice: one per link class).
"""

from __future__ import annotations

import numpy as np

_TOL = 1e-9


def max_min_rates(paths: np.ndarray, capacity: np.ndarray,
                  caps: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Rates (same unit as ``capacity``) and the bottleneck link of each flow.

    ``paths``: ``(F, L)`` link ids, -1 padded. ``capacity``: per link. ``caps``: per-flow rate
    limit (e.g. reduction throughput) or None. The bottleneck is -1 for a flow limited by its cap.
    """
    nflows = len(paths)
    rates = np.zeros(nflows)
    bott = np.full(nflows, -1, dtype=np.int64)
    if nflows == 0:
        return rates, bott
    valid = paths >= 0
    flow_of = np.repeat(np.arange(nflows), valid.sum(axis=1))
    used, link_of = np.unique(paths[valid], return_inverse=True)
    rem = capacity[used].astype(float)
    if not (rem > 0).all():   # a zero/negative/NaN link would never saturate or would stall
        bad = used[~(rem > 0)]
        raise ValueError(f"link capacity must be > 0; links {bad[:8].tolist()} have "
                         f"{capacity[bad[:8]].tolist()}")
    cap = np.full(nflows, np.inf) if caps is None else np.asarray(caps, dtype=float)
    if not (cap > 0).all():
        raise ValueError("per-flow rate caps must be > 0")
    frozen = np.zeros(nflows, dtype=bool)
    while not frozen.all():
        live = ~frozen[flow_of]
        count = np.bincount(link_of[live], minlength=len(used))
        with np.errstate(divide="ignore", invalid="ignore"):
            share = np.where(count > 0, rem / np.maximum(count, 1), np.inf)
        level = min(share.min(), cap[~frozen].min())
        if not np.isfinite(level):     # flows without links and without cap: unconstrained
            rates[~frozen] = np.inf
            break
        hit = share <= level * (1 + _TOL)
        on_hit = live & hit[link_of]
        by_link = np.zeros(nflows, dtype=bool)
        by_link[flow_of[on_hit]] = True
        bott[flow_of[on_hit]] = used[link_of[on_hit]]
        newly = by_link | (~frozen & ~by_link & (cap <= level * (1 + _TOL)))
        rates[newly] = level
        sub = newly[flow_of]
        rem -= np.bincount(link_of[sub], minlength=len(used)) * level
        if not newly.any():   # cannot happen with positive capacities; never spin forever
            raise RuntimeError("max_min_rates made no progress (inconsistent capacities)")
        frozen |= newly
    return rates, bott

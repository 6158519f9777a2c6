"""Measured cost curves: a candidate's time as a function of message size, from a tune sweep.

A :class:`Curve` holds ``(bytes, median us)`` points of one candidate measured on this machine
and layout (``tilecomm tune``). Between points it interpolates linearly in log-log space (time
grows smoothly and roughly as a power of the size between two sweep sizes); beyond the largest
point it extends the last segment linearly in bytes (the bandwidth term dominates there), and
below the smallest it stays flat (the fixed cost dominates). The curves are the cost model of
the inter-host candidates (``hier_*`` and ``engine``): what the hierarchical model
(``sim/hosts.py``) cannot know about Gloo's loopback TCP on this machine, measured instead.
"""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True)
class Curve:
    """``points``: ``((bytes, time_us), ...)`` sorted by bytes, bytes > 0, time > 0."""

    points: tuple[tuple[int, float], ...]

    def __post_init__(self):
        if not self.points:
            raise ValueError("a cost curve needs at least one measured point")
        sizes = [n for n, _ in self.points]
        if sizes != sorted(set(sizes)) or sizes[0] <= 0:
            raise ValueError(f"cost curve sizes must be positive and increasing, got {sizes}")
        if any(not (t > 0 and math.isfinite(t)) for _, t in self.points):
            raise ValueError(f"cost curve times must be positive, got {self.points}")

    @classmethod
    def of(cls, pairs) -> "Curve":
        return cls(tuple(sorted((int(n), float(t)) for n, t in pairs)))

    def at(self, nbytes: int) -> float:
        """Predicted time (us) of one call of ``nbytes``."""
        pts = self.points
        n = max(int(nbytes), 1)
        if n <= pts[0][0]:
            return pts[0][1]
        if len(pts) == 1:       # one point: proportional above it (no slope to extend)
            return pts[0][1] * n / pts[0][0]
        if n >= pts[-1][0]:
            (n0, t0), (n1, t1) = pts[-2], pts[-1]
            slope = max((t1 - t0) / (n1 - n0), 0.0)
            return t1 + slope * (n - n1)
        for (n0, t0), (n1, t1) in zip(pts, pts[1:]):
            if n0 <= n <= n1:
                f = math.log(n / n0) / math.log(n1 / n0)
                return math.exp(math.log(t0) + f * (math.log(t1) - math.log(t0)))
        raise AssertionError("unreachable: n lies between the first and last points")

    def to_json(self) -> list:
        return [[n, t] for n, t in self.points]

"""MoE expert-parallel dispatch and combine (:class:`ExpertParallel`).

:mod:`.routing` defines what moves; :mod:`.reference` is the slow reference; engines:
:mod:`.cpu` (shared memory), :mod:`.hosts` (across hosts), :mod:`.kernel` (Triton).
"""

from .dispatched import Dispatched, Grouped
from .ep import ExpertParallel
from .routing import random_topk

__all__ = ["ExpertParallel", "Dispatched", "Grouped", "random_topk"]

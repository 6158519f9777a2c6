"""``algo="auto"`` by predicted cost: the cost models (:mod:`.costs`), the measured curves
(:mod:`.curves`), what ``tilecomm tune`` stores (:mod:`.store`) and measures (:mod:`.sweep`)."""

from .costs import ENGINE, Choice, CostModel
from .store import current

__all__ = ["ENGINE", "Choice", "CostModel", "current"]

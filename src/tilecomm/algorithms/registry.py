"""The algorithm registry: ``(collective, algo) -> schedule builder``.

Each algorithm family lives in its own module and registers its builders with :func:`register`.
The CPU executor, the simulator, the checker and the GPU kernels all look schedules up here, so an
algorithm is defined exactly once.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Callable

from .collectives import COLLECTIVES
from .schedule import Schedule

Builder = Callable[[int, int], Schedule]  # (world_size, root) -> Schedule

_REGISTRY: dict[tuple[str, str], Builder] = {}


def register(collective: str, algo: str) -> Callable[[Builder], Builder]:
    """Decorator: register ``fn(world_size, root) -> Schedule`` as ``collective``/``algo``."""
    if collective not in COLLECTIVES:
        raise KeyError(f"unknown collective {collective!r}")

    def deco(fn: Builder) -> Builder:
        key = (collective, algo)
        if key in _REGISTRY and _REGISTRY[key] is not fn:
            raise ValueError(f"algorithm {collective}/{algo} registered twice")
        _REGISTRY[key] = fn
        return fn

    return deco


def algorithms(collective: str) -> list[str]:
    """Names of the algorithms registered for ``collective``, in registration order."""
    _load_families()
    return [a for (c, a) in _REGISTRY if c == collective]


def all_algorithms() -> list[tuple[str, str]]:
    _load_families()
    return list(_REGISTRY)


@lru_cache(maxsize=1024)
def get_schedule(collective: str, algo: str, world_size: int, root: int = 0) -> Schedule:
    """The schedule of ``collective`` with ``algo`` for ``world_size`` ranks (cached)."""
    _load_families()
    try:
        builder = _REGISTRY[(collective, algo)]
    except KeyError:
        known = ", ".join(algorithms(collective)) or "none"
        raise ValueError(
            f"no algorithm {algo!r} for {collective}; registered: {known}") from None
    if world_size < 1:
        raise ValueError(f"world_size must be >= 1, got {world_size}")
    if not 0 <= root < world_size:
        raise ValueError(f"root {root} out of range for world_size {world_size}")
    return builder(world_size, root)


def _load_families() -> None:
    # Importing the family modules runs their @register decorators (once). Registration
    # order is the order algorithms() lists, which names the tuner's fallback and the order
    # tests vary parameters in: a newer family is imported after the others.
    from . import direct, one_shot, pairwise, recursive, ring, tree, two_shot  # noqa: F401
    from . import rhd  # noqa: F401

"""What each collective promises: its buffers, their element layout, and its postcondition.

Shared by the checker (symbolic proof), the CPU executor (element ranges of chunks) and the
benchmarks (nccl-tests bus-bandwidth factors).

Chunk ``c`` of a buffer of ``total`` elements cut into ``n`` chunks covers elements
``[c * total // n, (c + 1) * total // n)``; ``all_to_all_v`` instead takes its chunk lengths from
the exchanged count matrix (``counts[src][dst]`` elements go from ``src`` to ``dst``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Sequence

from .schedule import Schedule

Token = tuple[int, str, int]  # (rank, buffer, chunk) of an input chunk
Value = frozenset  # set of tokens reduced into a location


@dataclass(frozen=True)
class CollectiveSpec:
    """The contract of one collective."""

    name: str
    inputs: tuple[str, ...]           # buffers whose contents are defined on entry
    outputs: tuple[str, ...]          # buffers whose contents the collective defines
    rooted: bool                      # broadcast/reduce take a root
    reduces: bool                     # takes a reduction op
    busbw_factor: Callable[[int], float]  # nccl-tests factor: busbw = algbw * factor(world)

    def expected(self, sched: Schedule, rank: int, buf: str, chunk: int) -> Value | None:
        """The set of input tokens ``rank.buf[chunk]`` must hold at the end (None: undefined)."""
        return _EXPECTED[self.name](sched, rank, buf, chunk)


def _ring_factor(n: int) -> float:
    return (n - 1) / n if n > 1 else 1.0


def _allreduce_factor(n: int) -> float:
    return 2 * (n - 1) / n if n > 1 else 1.0


def _all_ranks(sched: Schedule, buf: str, chunk: int) -> Value:
    return frozenset((j, buf, chunk) for j in range(sched.world_size))


def _exp_all_reduce(s, r, buf, c):
    return _all_ranks(s, "buf", c) if buf == "buf" else None


def _exp_broadcast(s, r, buf, c):
    return frozenset({(s.root, "buf", c)}) if buf == "buf" else None


def _exp_reduce(s, r, buf, c):
    if buf != "buf":
        return None
    return _all_ranks(s, "buf", c) if r == s.root else frozenset({(r, "buf", c)})


def _exp_all_gather(s, r, buf, c):
    if buf == "out":
        return frozenset({(c, "in", 0)})
    return frozenset({(r, "in", c)}) if buf == "in" else None


def _exp_reduce_scatter(s, r, buf, c):
    if buf == "out":
        return frozenset((j, "in", r) for j in range(s.world_size))
    return frozenset({(r, "in", c)}) if buf == "in" else None


def _exp_all_to_all(s, r, buf, c):
    if buf == "out":
        return frozenset({(c, "in", r)})
    return frozenset({(r, "in", c)}) if buf == "in" else None


_EXPECTED = {
    "all_reduce": _exp_all_reduce,
    "broadcast": _exp_broadcast,
    "reduce": _exp_reduce,
    "all_gather": _exp_all_gather,
    "reduce_scatter": _exp_reduce_scatter,
    "all_to_all": _exp_all_to_all,
    "all_to_all_v": _exp_all_to_all,
    "barrier": lambda s, r, buf, c: None,
}

COLLECTIVES: dict[str, CollectiveSpec] = {
    spec.name: spec
    for spec in [
        CollectiveSpec("all_reduce", ("buf",), ("buf",), False, True, _allreduce_factor),
        CollectiveSpec("broadcast", ("buf",), ("buf",), True, False, lambda n: 1.0),
        CollectiveSpec("reduce", ("buf",), ("buf",), True, True, lambda n: 1.0),
        CollectiveSpec("all_gather", ("in",), ("out", "in"), False, False, _ring_factor),
        CollectiveSpec("reduce_scatter", ("in",), ("out", "in"), False, True, _ring_factor),
        CollectiveSpec("all_to_all", ("in",), ("out", "in"), False, False, _ring_factor),
        CollectiveSpec("all_to_all_v", ("in",), ("out", "in"), False, False, _ring_factor),
        CollectiveSpec("barrier", (), (), False, False, lambda n: 0.0),
    ]
}

# Point-to-point is not a schedule, but benchmarks and the simulator share its factor.
BUSBW_FACTOR: dict[str, Callable[[int], float]] = {
    **{name: spec.busbw_factor for name, spec in COLLECTIVES.items()},
    "send_recv": lambda n: 1.0,
}


def buffer_totals(collective: str, world_size: int, count: int) -> dict[str, int]:
    """Element count of each user-visible buffer, from the per-collective ``count``.

    ``count`` is the element count of the tensor the caller passes: the in-place buffer for
    all_reduce/broadcast/reduce, the input for all_gather (``m``), reduce_scatter and all_to_all
    (``world_size * m``).
    """
    w = world_size
    if collective in ("all_reduce", "broadcast", "reduce"):
        return {"buf": count}
    if collective == "all_gather":
        return {"in": count, "out": count * w}
    if collective == "reduce_scatter":
        return {"in": count, "out": count // w}
    if collective == "all_to_all":
        return {"in": count, "out": count}
    if collective == "barrier":
        return {}
    raise KeyError(f"no fixed layout for {collective!r}")


def even_chunks(total: int, nchunks: int) -> list[int]:
    """Lengths of ``nchunks`` near-equal chunks of ``total`` elements (earlier chunks smaller)."""
    return [(c + 1) * total // nchunks - c * total // nchunks for c in range(nchunks)]


def chunk_lengths(sched: Schedule, rank: int, buf: str, count: int,
                  counts: Sequence[Sequence[int]] | None = None) -> list[int]:
    """Element length of every chunk of ``rank``'s buffer ``buf``.

    ``counts`` (``all_to_all_v`` only) is the ``world_size x world_size`` matrix of elements sent
    from row rank to column rank.
    """
    spec = sched.buffer(buf)
    name = spec.like or buf
    if sched.collective == "all_to_all_v":
        assert counts is not None, "all_to_all_v needs the count matrix"
        w = sched.world_size
        if name == "in":
            return [counts[rank][j] for j in range(w)]
        return [counts[j][rank] for j in range(w)]
    total = buffer_totals(sched.collective, sched.world_size, count)[name]
    return even_chunks(total, sched.buffer(name).nchunks)

"""Do the ranks agree on a call? One helper for every layer that compares descriptors.

Every layer that lets ranks meet on a call makes each rank describe it as a few ints, gathers
every rank's description (a host exchange, a descriptor slot in shared memory, a rail header)
and compares them, so that ranks that disagree all raise :class:`~tilecomm.CommMismatch`
instead of exchanging mismatched data. What differs between the layers is where the ints
travel; what they compare and how they say it is this module:

    DESC = Descriptor("op", "dtype", "count", show={"dtype": dtype_name})
    rows = comm.exchange(DESC.pack(op=..., dtype=..., count=...))
    DESC.compare("all_gather_matmul", rows, ("dtype", "count"))
    # CommMismatch: all_gather_matmul: ranks disagree on count: rank 0: 4, rank 1: 5

A field's label (what the message calls it) defaults to its name; ``show`` turns a rank's
int into what the user passed (a dtype's name, an op's name).
"""

from __future__ import annotations

from typing import Callable, Mapping, Sequence

from .errors import CommMismatch


def disagreement(what: str, label: str, values: Sequence, show: Callable = str, *,
                 ranks: Sequence[int] | None = None, who: str = "ranks") -> str | None:
    """The message naming ``label`` and each rank's value when ``values`` (one per rank, in
    rank order, or of ``ranks``) are not all equal; None when they are."""
    if len(set(values)) <= 1:
        return None
    ranks = range(len(values)) if ranks is None else ranks
    shown = ", ".join(f"rank {r}: {show(v)}" for r, v in zip(ranks, values))
    return f"{what}: {who} disagree on {label}: {shown}"


def compare(what: str, rows: Sequence[Sequence[int]],
            fields: Sequence[tuple[int, str, Callable]], *,
            ranks: Sequence[int] | None = None, who: str = "ranks") -> None:
    """Raise ``CommMismatch`` for the first field (``(index, label, show)``) on which the rows
    of the ranks (in rank order, or of ``ranks``) differ, naming it and each rank's value."""
    for idx, label, show in fields:
        msg = disagreement(what, label, [r[idx] for r in rows], show, ranks=ranks, who=who)
        if msg is not None:
            raise CommMismatch(msg)


class Descriptor:
    """Named int fields in a fixed order: what a rank says of its call."""

    def __init__(self, *names: str, labels: Mapping[str, str] | None = None,
                 show: Mapping[str, Callable] | None = None):
        self.names = tuple(names)
        self.index = {n: i for i, n in enumerate(self.names)}
        self.labels = dict(labels or {})
        self.show = dict(show or {})

    def __len__(self) -> int:
        return len(self.names)

    def pack(self, **values: int) -> list[int]:
        """The ints in field order (a field not given is 0)."""
        unknown = set(values) - set(self.index)
        if unknown:
            raise KeyError(f"descriptor has no field(s) {sorted(unknown)}")
        return [int(values.get(n, 0)) for n in self.names]

    def get(self, row: Sequence[int], name: str) -> int:
        return int(row[self.index[name]])

    def fields(self, names: Sequence[str]) -> list[tuple[int, str, Callable]]:
        """``(index, label, show)`` of ``names``, for :func:`compare`."""
        return [(self.index[n], self.labels.get(n, n), self.show.get(n, str)) for n in names]

    def compare(self, what: str, rows: Sequence[Sequence[int]], names: Sequence[str]) -> None:
        """``CommMismatch`` naming the first of ``names`` the ranks' rows differ on."""
        compare(what, rows, self.fields(names))

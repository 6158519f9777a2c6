"""Which ranks share a host, and the rails that connect hosts.

A :class:`HostLayout` is the two-level view of a communicator: ``hosts[h]`` lists the global
ranks of host ``h`` in local-rank order (hosts ordered by their lowest rank). Ranks of one host
share a symmetric heap; ranks of different hosts only talk through torch.distributed.

*Rails.* Rail ``c`` (``0 <= c < max_local``) holds one rank per host: local rank ``c`` of
every host that has one, and on a host with fewer ranks local rank ``c mod L_h`` (so a rank of
a small host may sit on several rails). On an even layout rail ``c`` is simply "local rank c
of every host", the NVLink/NIC rail of a GPU cluster.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property


@dataclass(frozen=True)
class HostLayout:
    """``hosts``: tuple of tuples of global ranks, each in local-rank order."""

    hosts: tuple[tuple[int, ...], ...]

    def __post_init__(self):
        ranks = sorted(r for h in self.hosts for r in h)
        if ranks != list(range(len(ranks))) or any(not h for h in self.hosts):
            raise ValueError(f"a host layout must partition ranks 0..W-1 into non-empty hosts, "
                             f"got {self.hosts}")

    @classmethod
    def of(cls, host_ids) -> "HostLayout":
        """The layout from each rank's host id (any hashable), ranks in global order."""
        order: dict = {}
        for r, h in enumerate(host_ids):
            order.setdefault(h, []).append(r)
        return cls(tuple(tuple(v) for v in order.values()))

    @classmethod
    def even(cls, num_hosts: int, per_host: int) -> "HostLayout":
        return cls(tuple(tuple(range(h * per_host, (h + 1) * per_host))
                         for h in range(num_hosts)))

    @classmethod
    def sizes(cls, *sizes: int) -> "HostLayout":
        """Hosts of the given sizes with consecutive ranks, e.g. ``sizes(2, 1)``."""
        out, r = [], 0
        for n in sizes:
            out.append(tuple(range(r, r + n)))
            r += n
        return cls(tuple(out))

    @property
    def world_size(self) -> int:
        return sum(len(h) for h in self.hosts)

    @property
    def num_hosts(self) -> int:
        return len(self.hosts)

    @cached_property
    def max_local(self) -> int:
        return max(len(h) for h in self.hosts)

    @cached_property
    def is_even(self) -> bool:
        return len({len(h) for h in self.hosts}) == 1

    @cached_property
    def _where(self) -> dict[int, tuple[int, int]]:
        return {r: (h, l) for h, ranks in enumerate(self.hosts) for l, r in enumerate(ranks)}

    def host_of(self, rank: int) -> int:
        return self._where[rank][0]

    def local_rank(self, rank: int) -> int:
        return self._where[rank][1]

    def rail(self, c: int) -> tuple[int, ...]:
        """Members of rail ``c``, one per host, in host order."""
        return tuple(h[c % len(h)] for h in self.hosts)

    def rails_of(self, rank: int) -> tuple[int, ...]:
        """The rails ``rank`` sits on, in increasing order."""
        return tuple(c for c in range(self.max_local) if rank in self.rail(c))

    def describe(self) -> str:
        return " + ".join(str(len(h)) for h in self.hosts) + " ranks"


class Topology:
    """A rank's place in a :class:`~tilecomm.hier.layout.HostLayout`."""

    def __init__(self, layout, rank: int):
        self.layout, self.rank = layout, rank
        self.host = layout.host_of(rank)
        self.local_rank = layout.local_rank(rank)
        self.local_size = len(layout.hosts[self.host])
        self.num_hosts = layout.num_hosts
        self.rails = layout.rails_of(rank) if layout.num_hosts > 1 else ()
        self.host_ranks = layout.hosts[self.host]

    def describe(self, rank: int | None = None) -> str:
        r = self.rank if rank is None else rank
        return (f"rank {r}: host {self.layout.host_of(r)} of {self.num_hosts}, local rank "
                f"{self.layout.local_rank(r)}")

    def __repr__(self) -> str:
        return (f"Topology(host={self.host}, local_rank={self.local_rank}, "
                f"local_size={self.local_size}, num_hosts={self.num_hosts}, rails={self.rails})")

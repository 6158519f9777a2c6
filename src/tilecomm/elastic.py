"""Keep going when ranks fail: the survivors' ``shrink``, and ``grow`` with new ranks.

``comm.abort()`` and ``comm.revoke()`` stop a communicator on every rank (the stop word,
NOTE [stop word] in backends/cpu/channel.py); this module makes the next communicator.

NOTE [new communicators]
    A shrunk or grown communicator is a new one, made the way every communicator is made:
    :func:`tilecomm.launch.connect` over a rendezvous store, so it has its own segments (its
    own symmetric heap), host discovery and, across hosts, its own inter-host groups. What
    differs is how the ranks find the store:

    * **one host** (``shrink``): the survivors meet in the old communicator's control blocks,
      which stay mapped whatever happened to the excluded ranks (dead, stopped, or alive and
      left out). Each posts its vote, one word: the attempt it is in and a crc of its exclude
      list (in one word, so a vote is never read with another attempt's list); each checks
      that every survivor voted alike (``CommMismatch`` naming each one's list otherwise,
      also when a survivor has already given up on this attempt and moved on); the lowest
      survivor starts a TCP store on 127.0.0.1 and posts its port; the others connect. No
      file, so a rank killed in the middle leaves nothing in ``/dev/shm``; every wait there
      is bounded by the timeout and ends early when a survivor dies.
    * **across hosts** (``shrink``): the store the communicator was made with (torchrun's),
      under a prefix per generation and attempt; the host that holds it must survive.
    * ``grow``: rank 0 of the running communicator starts a TCP store and every running rank
      learns its port from a collective; the ticket names it, and the new processes connect
      through it (``tilecomm.join``).

    Ranks keep their order: survivors are renumbered 0..n-1 in their old order, new ranks
    follow the running ones.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass, field
from datetime import timedelta
from urllib.parse import parse_qs, urlsplit

from .errors import CommError, CommMismatch, CommTimeout


@dataclass
class Membership:
    """How a communicator's ranks met, for making the next one (NOTE [new communicators]).

    ``store``: the rendezvous store of a communicator made by ``connect`` / ``init`` (None for
    ``tilecomm.launch``); ``generation``: 0 at the start, one more per shrink or grow;
    ``attempts``: shrink calls made on this communicator (each meets under its own key);
    ``keep``: objects that must live as long as the communicator (a TCP store this rank
    serves to the others)."""

    store: object | None = None
    generation: int = 0
    attempts: int = 0
    keep: list = field(default_factory=list)


def exclude_list(comm, exclude) -> list[int]:
    """``exclude`` checked against ``comm``: sorted distinct ranks, not this one, not all."""
    try:
        ranks = sorted({int(r) for r in exclude})
    except (TypeError, ValueError):
        raise ValueError(f"shrink: exclude must be a list of ranks, got {exclude!r}") from None
    bad = [r for r in ranks if not 0 <= r < comm.world_size]
    if bad:
        raise ValueError(f"shrink: exclude names ranks {bad} outside 0..{comm.world_size - 1}")
    if comm.rank in ranks:
        raise ValueError(f"shrink: rank {comm.rank} excludes itself; shrink is called by the "
                         f"survivors only (an excluded rank just closes its communicator)")
    return ranks


def shrink(comm, excluded: list[int], timeout: float):
    """The survivors' new communicator (see ``Communicator.shrink``)."""
    from .launch import connect, dist_prefix

    survivors = [r for r in range(comm.world_size) if r not in excluded]
    member = comm.membership
    member.attempts += 1
    lay = comm.host.heap.layout
    sizes = dict(heap_bytes=lay.heap_bytes, scratch_bytes=lay.scratch_bytes)
    me = survivors.index(comm.rank)
    if comm.layout.num_hosts == 1:
        store, keep = _meet_in_segments(comm, survivors, excluded, member.attempts, timeout)
        prefix = "shrink"
    else:
        if member.store is None:
            raise CommError("shrink: this communicator spans hosts but was not made through a "
                            "store (tilecomm.init / connect); nothing to meet through")
        store, keep = member.store, []
        prefix = f"tilecomm/shrink/g{member.generation}.{member.attempts}"
        _agree_in_store(store, prefix, comm.rank, survivors, excluded, timeout)
    new = connect(dist_prefix(store, prefix), me, len(survivors), timeout=timeout,
                  deterministic=comm.deterministic, **sizes)
    new.membership.generation = member.generation + 1
    new.membership.keep.extend(keep)
    return new


def _meet_in_segments(comm, survivors, excluded, attempt: int, timeout: float):
    """One host: agree on ``excluded`` and on a TCP store through the old control blocks."""
    import torch.distributed as dist

    ch = comm.host.channel
    lay = ch.layout
    base = lay.stop
    me = ch.me
    listed = ",".join(map(str, excluded)).encode()
    me[base + lay.SHRINK_EXCLUDE] = _mask(excluded)
    me[base + lay.SHRINK_VOTE] = attempt << 32 | zlib.crc32(listed)
    what = ("shrink", attempt, f"the survivors {survivors} to call shrink")
    ch.timeout = timeout        # the old communicator takes no more calls: its bound is ours
    ch.wait_slots([(r, base + lay.SHRINK_VOTE) for r in survivors], attempt << 32, what,
                  recovering=True)
    votes = {r: int(ch.slots[r][base + lay.SHRINK_VOTE]) for r in survivors}
    ahead = [r for r, v in votes.items() if v >> 32 > attempt]
    if ahead or len(set(votes.values())) > 1:
        lists = {r: _unmask(int(ch.slots[r][base + lay.SHRINK_EXCLUDE])) for r in survivors}
        said = "; ".join(f"rank {r} excludes {x}" for r, x in lists.items())
        if ahead:       # it gave up on this attempt (it saw a disagreement) and called again
            said += f"; rank(s) {ahead} already gave up on this attempt"
        raise CommMismatch(f"shrink (attempt {attempt}) on rank {comm.rank}: the survivors "
                           f"disagree on whom to exclude: {said}")
    lowest = survivors[0]
    tmo = timedelta(seconds=timeout)
    if comm.rank == lowest:
        store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False,
                              timeout=tmo)
        me[base + lay.SHRINK_PORT] = attempt << 32 | store.port
        return store, [store]
    ch.wait_slots([(lowest, base + lay.SHRINK_PORT)], attempt << 32,
                  ("shrink", attempt, f"rank {lowest} (the lowest survivor) to start the "
                   f"rendezvous"), recovering=True)
    port = int(ch.slots[lowest][base + lay.SHRINK_PORT]) & 0xFFFFFFFF
    return dist.TCPStore("127.0.0.1", port, is_master=False, timeout=tmo), []


def _agree_in_store(store, prefix: str, rank: int, survivors, excluded, timeout: float):
    """Across hosts: agree on ``excluded`` through the store (CommMismatch otherwise)."""
    store.set(f"{prefix}/exclude/{rank}", ",".join(map(str, excluded)))
    keys = [f"{prefix}/exclude/{r}" for r in survivors]
    wait_keys(store, keys, survivors, timeout, f"shrink on rank {rank}", "to call shrink")
    views = {r: store.get(k).decode() for r, k in zip(survivors, keys)}
    if len(set(views.values())) > 1:
        said = "; ".join(f"rank {r} excludes [{v}]" for r, v in views.items())
        raise CommMismatch(f"shrink on rank {rank}: the survivors disagree on whom to "
                           f"exclude: {said}")


def wait_keys(store, keys, ranks, timeout: float, what: str, doing: str) -> None:
    """Wait (at most ``timeout`` s) until every key of ``keys`` is in ``store``; a
    CommTimeout naming the ranks (``ranks[i]`` sets ``keys[i]``) that never did."""
    try:
        store.wait(keys, timedelta(seconds=timeout))
    except Exception as e:  # noqa: BLE001 - the store's own timeout (DistStoreError) and kin
        try:
            missing = tuple(r for r, k in zip(ranks, keys) if not store.check([k]))
        except Exception:  # noqa: BLE001 - the store itself is gone
            missing = ()
        if not missing:
            raise CommError(f"{what}: the rendezvous store stopped answering while waiting "
                            f"for ranks {list(ranks)} {doing} (did the rank serving it "
                            f"fail?): {type(e).__name__}: {e}") from None
        raise CommTimeout(f"{what}: rank(s) {list(missing)} did not arrive {doing} within "
                          f"{timeout:g} s ({type(e).__name__})", collective=what.split()[0],
                          seq=0, missing=missing) from None


def _mask(ranks) -> int:
    """``ranks`` below 62 as a bit mask (what the messages show; the vote is the crc)."""
    return sum(1 << r for r in ranks if r < 62)


def _unmask(m: int) -> list[int]:
    return [r for r in range(62) if m >> r & 1]


# ---- grow -------------------------------------------------------------------------------------
class Growth:
    """What ``comm.grow(n)`` returns on every running rank: the ``ticket`` the new processes
    pass to :func:`tilecomm.join`, and :meth:`join`, which returns the grown communicator
    once they have joined."""

    def __init__(self, comm, ticket: str, store):
        self._comm, self.ticket, self._store = comm, ticket, store

    def join(self):
        """The grown communicator (this rank keeps its number): waits, at most the grow's
        timeout, for the new ranks, naming any that never arrive."""
        old = self._comm
        new = _connect_grown(self._store, old.rank, parse_ticket(self.ticket),
                             old.membership.keep if old.rank == 0 else [])
        new.retire(old)
        return new


def grow(comm, n: int, timeout: float, host: str) -> Growth:
    """Start a grow by ``n`` ranks (collective over the running ranks; see
    ``Communicator.grow``)."""
    import torch.distributed as dist

    if not isinstance(n, int) or isinstance(n, bool) or n < 1:
        raise ValueError(f"grow: n must be a positive int (the number of new ranks), got {n!r}")
    tmo = timedelta(seconds=timeout)
    store, port = None, 0
    if comm.rank == 0:
        store = dist.TCPStore(host, 0, is_master=True, wait_for_workers=False, timeout=tmo)
        port = store.port
    lay = comm.host.heap.layout
    gen = comm.membership.generation + 1
    port = comm.exchange([port])[0][0]
    if store is None:
        store = dist.TCPStore(host, port, is_master=False, timeout=tmo)
    ticket = (f"tilecomm://{host}:{port}/g{gen}?world={comm.world_size + n}"
              f"&first={comm.world_size}&timeout={timeout:g}&heap={lay.heap_bytes}"
              f"&scratch={lay.scratch_bytes}&deterministic={int(comm.deterministic)}")
    g = Growth(comm, ticket, store)
    if comm.rank == 0:
        comm.membership.keep.append(store)
    return g


@dataclass
class Ticket:
    host: str
    port: int
    generation: int
    world_size: int
    first: int
    timeout: float
    heap_bytes: int
    scratch_bytes: int
    deterministic: bool


def parse_ticket(ticket: str) -> Ticket:
    """The fields of a grow ticket (``Growth.ticket``); ValueError naming what is wrong."""
    try:
        u = urlsplit(ticket)
        q = {k: v[0] for k, v in parse_qs(u.query).items()}
        if u.scheme != "tilecomm" or not u.path.startswith("/g"):
            raise ValueError("not a tilecomm:// ticket")
        return Ticket(u.hostname, int(u.port), int(u.path[2:]), int(q["world"]),
                      int(q["first"]), float(q["timeout"]), int(q["heap"]), int(q["scratch"]),
                      q["deterministic"] == "1")
    except (ValueError, KeyError, TypeError) as e:
        raise ValueError(f"join: {ticket!r} is not a ticket from comm.grow(n).ticket "
                         f"({e})") from None


def join(ticket: str, index: int):
    """The grown communicator for the ``index``-th new process (0-based) of a grow
    (``tilecomm.join``)."""
    import torch.distributed as dist

    t = parse_ticket(ticket)
    new = t.world_size - t.first
    if not isinstance(index, int) or not 0 <= index < new:
        raise ValueError(f"join: index must be an int in 0..{new - 1} (this grow adds {new} "
                         f"ranks), got {index!r}")
    store = dist.TCPStore(t.host, t.port, is_master=False, timeout=timedelta(seconds=t.timeout))
    return _connect_grown(store, t.first + index, t, [])


def _connect_grown(store, rank: int, t: Ticket, keep: list):
    from .launch import connect, dist_prefix

    # connect waits for every rank's arrival first (bounded; it names the ranks that never
    # joined)
    comm = connect(dist_prefix(store, f"grow/g{t.generation}"), rank, t.world_size,
                   timeout=t.timeout, heap_bytes=t.heap_bytes, scratch_bytes=t.scratch_bytes,
                   deterministic=t.deterministic)
    comm.membership.generation = t.generation
    comm.membership.keep.extend(keep)
    return comm

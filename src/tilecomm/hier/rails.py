"""The inter-host leg: rail and world process groups of torch.distributed, and the call header.

Every rail exchange starts with one fixed-size ``all_gather`` of a *header* (the call's
collective, algorithm, dtype, count, op, root, sequence number, or an error this rank hit) and,
when it fits, the payload itself: a small call costs one inter-host round, and ranks whose
calls disagree see every member's header before any variable-size message is sent (Gloo
aborts the process on mismatched sizes, so sizes must be proven equal first). A rank that
failed before a rail step still takes part in its header round with an error header, so the
other hosts raise at once, naming the cause, instead of timing out.

NOTE [stop across hosts]
    An abort or revoke (``comm.abort``) stops the aborting rank's host through its stop word;
    the other hosts hear of it through the rails: the rank writes who stopped the
    communicator and why into the store (``stopped`` key, first writer wins) and aborts its
    process groups, so a partner waiting in a Gloo exchange with it fails at once instead of
    at the timeout; a rank whose rail exchange fails finds the key and raises CommAborted /
    CommRevoked naming the rank that stopped it, and relays it (``HierBackend.relay_stop``):
    its host's stop word, then its own groups. A rank blocked in an exchange with a partner
    that is itself blocked elsewhere would not hear of it that way, so every rank also keeps
    a watcher thread (``watch``) blocked in the store's wait on a key of its own (its own
    connection), which the stopping rank sets for every rank (and ``close`` for this one):
    when it is set by a stop, the watcher relays the stop at once. So the stop reaches every
    rank of every host within a store round trip, and the normal path pays nothing.

Groups are built straight from the store (``ProcessGroupGloo(store, rank, size)``), so this
works inside ``init_process_group("tilecomm")`` too, before any default group exists; on
CUDA tensors the same rails use ``ProcessGroupNCCL`` (created on first use).
"""

from __future__ import annotations

import zlib
from datetime import timedelta

import numpy as np
import torch
import torch.distributed as dist

from ..agree import compare
from ..errors import CommAborted, CommError, CommMismatch, CommTimeout, stopped_error

MAGIC = 0x7443_6F6D_6D48   # "tComH"
SMALL = 4096               # payload bytes carried inside the header round
HDR_WORDS = 16
HDR_BYTES = HDR_WORDS * 8
ROUND1 = HDR_BYTES + SMALL
# header words
H_MAGIC, H_STATUS, H_SEQ, H_COLL, H_ALGO, H_DTYPE, H_COUNT, H_OP, H_ROOT, H_NBYTES, \
    H_MSGLEN, H_NMISS = range(12)
H_MISS = 12                # up to 3 missing ranks
MAX_MISS = 3
H_ROWS = 15                # hash of the row shape (the dims after dim 0; 0 for none)
ERR_KINDS = {1: CommError, 2: CommMismatch, 3: CommTimeout}
KIND_OF = {CommMismatch: 2, CommTimeout: 3}
FIELDS = ((H_COLL, "collective"), (H_ALGO, "algorithm"), (H_DTYPE, "dtype"),
          (H_COUNT, "count"), (H_OP, "op"), (H_ROOT, "root"), (H_NBYTES, "message bytes"),
          (H_ROWS, "row shape (the dims after dim 0)"))


def name_id(text: str) -> int:
    return zlib.crc32(text.encode()) & 0x7FFF_FFFF


class Rails:
    """This rank's process groups across hosts: one per rail it sits on, and one over all ranks
    (point-to-point between hosts). ``device``: "cpu" (Gloo) or "cuda" (NCCL)."""

    def __init__(self, store, layout, rank: int, timeout: float, device: str = "cpu",
                 host: str | None = None):
        self.layout, self.rank, self.device = layout, rank, device
        self.timeout = timeout
        # NOTE [stop across hosts]: who stopped the communicator, for every rank to read
        self._stop_store = dist.PrefixStore(f"tilecomm/{device}/stopped", store)
        self._watcher = None
        self._names: dict[int, str] = {}
        prefix = f"tilecomm/{device}"

        def make(tag: str, members, seconds: float | None = None):
            td = timedelta(seconds=timeout if seconds is None else seconds)
            st = dist.PrefixStore(f"{prefix}/{tag}", store)
            idx = members.index(rank)
            if device == "cuda":
                opts = dist.ProcessGroupNCCL.Options()
                opts._timeout = td
                return dist.ProcessGroupNCCL(st, idx, len(members), opts)
            opts = dist.ProcessGroupGloo._Options()
            opts._timeout = td
            opts._devices = [dist.ProcessGroupGloo.create_device(hostname=host)
                             if host else dist.ProcessGroupGloo.create_default_device()]
            return dist.ProcessGroupGloo(st, idx, len(members), opts)

        self._make = make
        self._extra: list = []          # groups made for layers above (new_world_group)
        self.groups = {}
        for c in layout.rails_of(rank):
            self.groups[c] = make(f"rail{c}", list(layout.rail(c)))
        self.world = make("world", list(range(layout.world_size)))

    def new_world_group(self, name: str, timeout: float | None = None):
        """A fresh group over all ranks for a layer above the communicator (its own tags and
        connections, so its messages never meet the collectives'); ``timeout``: its Gloo
        timeout (default the rails'). Collective; closed with the rails."""
        pg = self._make(f"extra{len(self._extra)}/{name}", list(range(self.layout.world_size)),
                        timeout)
        self._extra.append(pg)
        return pg

    def abort(self, by: int, reason: str, revoke: bool) -> None:
        """Tell the other hosts that rank ``by`` stopped the communicator (NOTE [stop across
        hosts]): record it in the store (the first stop stays), then abort this rank's groups
        so that partners waiting on it fail now. Any thread."""
        try:
            self._stop_store.compare_set("who", "", f"{int(revoke)}|{by}|{reason}")
            for r in range(self.layout.world_size):     # every rank's watcher wakes
                self._stop_store.compare_set(f"wake/{r}", "", "stop")
        except Exception:  # noqa: BLE001 - the store's host may be gone: the aborts still help
            pass
        for pg in list(self.groups.values()) + [self.world] + self._extra:
            try:
                pg.abort()
            except Exception:  # noqa: BLE001 - best effort: a group already broken
                pass

    def watch(self, relay) -> None:
        """Start the watcher of NOTE [stop across hosts]: ``relay(by, reason, revoke)`` runs
        on its thread when a rank stops the communicator. It waits on this rank's own wake
        key, which a stop sets for every rank and ``close`` for this one."""
        import threading

        try:
            store = self._stop_store.clone()      # the main thread's calls never queue on it
        except Exception:  # noqa: BLE001 - a store that cannot be cloned: no watcher
            return
        key = f"wake/{self.rank}"

        def run():
            while True:
                try:
                    store.wait([key], timedelta(hours=1))
                    break
                except Exception:  # noqa: BLE001 - the wait's timeout, or the store is gone
                    try:
                        store.check([key])
                    except Exception:  # noqa: BLE001 - gone: nothing more to hear
                        return
            try:
                if store.get(key) != b"stop":
                    return                          # closed
            except Exception:  # noqa: BLE001 - the store is gone
                return
            who = _who(store)
            if who is not None:
                relay(*who)

        self._watcher = threading.Thread(target=run, name=f"tilecomm-stop-watch-{self.rank}",
                                         daemon=True)
        self._watcher.start()

    def stopped(self, what: str, seq: int) -> CommAborted | None:
        """The CommAborted / CommRevoked for call ``what`` #``seq`` if a rank stopped the
        communicator (the store says who), else None."""
        who = _who(self._stop_store)
        if who is None:
            return None
        by, reason, revoke = who
        return stopped_error(revoke, by, reason, f"{what} #{seq} on rank {self.rank}: ",
                             " (on another host)")

    def close(self) -> None:
        w = self._watcher
        if w is not None and w.is_alive():
            try:
                self._stop_store.compare_set(f"wake/{self.rank}", "", "closed")
                w.join(timeout=5)       # not left in a store call when the process exits
            except Exception:  # noqa: BLE001 - the store is gone: the watcher has ended
                pass
        self._watcher = None
        for pg in list(self.groups.values()) + [self.world] + self._extra:
            try:
                pg.shutdown()
            except Exception:  # noqa: BLE001 - best effort at teardown
                pass
        self.groups.clear()
        self._extra.clear()

    # ---- header round -----------------------------------------------------------------------
    def header(self, seq: int, collective: str, algo: str, dtype_id: int, count: int,
               op_id: int, root: int, nbytes: int, error: BaseException | None = None,
               rows: tuple = ()):
        """The fixed-size block this rank contributes to a header round (uint8 tensor).
        ``rows``: the row shape of all_gather / all_to_all(_v) (equal counts with different
        row shapes would put the right bytes in the wrong rows)."""
        block = np.zeros(ROUND1, dtype=np.uint8)
        words = block[:HDR_BYTES].view(np.int64)
        words[:H_NBYTES + 1] = (MAGIC, 0, seq, name_id(collective), name_id(algo), dtype_id,
                                count, op_id, root, nbytes)
        words[H_ROWS] = name_id(repr(tuple(rows))) if rows else 0
        if error is not None:
            words[H_STATUS] = KIND_OF.get(type(error), 1)
            missing = tuple(getattr(error, "missing", ()))[:MAX_MISS]
            words[H_NMISS] = len(missing)
            words[H_MISS:H_MISS + len(missing)] = missing
            text = f"{type(error).__name__}: {error}".encode()[:SMALL]
            words[H_MSGLEN] = len(text)
            block[HDR_BYTES:HDR_BYTES + len(text)] = np.frombuffer(text, dtype=np.uint8)
        return torch.from_numpy(block)

    def round1(self, c: int, hdr: torch.Tensor, what: str, seq: int,
               rows: tuple = ()) -> list[torch.Tensor]:
        """All-gather the fixed-size header block on rail ``c``; raise what any member reports
        (``rows``: this rank's row shape, for the message)."""
        return self.header_round(self.groups[c], self.layout.rail(c), hdr, what, seq, rows)

    def header_round(self, pg, members, hdr: torch.Tensor, what: str, seq: int,
                     rows: tuple = ()) -> list[torch.Tensor]:
        """All-gather the fixed-size header block among ``members`` (global ranks, in the
        order of ``pg``'s ranks: a rail group, or :attr:`world` with every rank); raise what
        any member reports, or ``CommMismatch`` when their calls differ."""
        members = list(members)
        me = members.index(self.rank)
        outs = [hdr if i == me else torch.empty(ROUND1, dtype=torch.uint8)
                for i in range(len(members))]
        self.pairwise(pg, members, hdr, outs, what, seq, tag=0)
        words = np.stack([o.numpy()[:HDR_BYTES].view(np.int64) for o in outs])
        if words[:, H_STATUS].any():
            for i, m in enumerate(members):
                st = int(words[i, H_STATUS])
                if not st or m == self.rank:
                    continue
                text = bytes(outs[i].numpy()[HDR_BYTES:HDR_BYTES + int(words[i, H_MSGLEN])]
                             ).decode(errors="replace")
                cls = ERR_KINDS.get(st, CommError)
                missing = tuple(int(x) for x in words[i, H_MISS:H_MISS + int(words[i, H_NMISS])])
                msg = f"{what} #{seq}: rank {m} (another host) reports: {text}"
                if cls is CommTimeout:
                    raise CommTimeout(msg, collective=what, seq=seq, missing=missing or (m,))
                raise cls(msg)
        if (words != words[0]).any():
            mine = int(words[members.index(self.rank), H_ROWS])
            # H_ROWS is a hash: this rank knows only its own shape
            show = {H_ROWS: lambda v: f"{'' if v == mine else 'not '}{rows}"}
            compare(f"{what} #{seq}", words.tolist(),
                    [(idx, label, show.get(idx, lambda v, idx=idx: _show(idx, v, what)))
                     for idx, label in FIELDS + ((H_SEQ, "sequence number"),)],
                    ranks=members, who="ranks on different hosts")
        return outs

    # ---- data -------------------------------------------------------------------------------
    def all_gather(self, c: int, mine: torch.Tensor, round1, what: str, seq: int,
                   nbytes: int, scratch=None) -> list[torch.Tensor]:
        """Every rail member's ``nbytes`` payload (uint8); from ``round1`` when it fitted."""
        members = self.layout.rail(c)
        if nbytes <= SMALL and mine.device.type == "cpu":     # it came with the header
            return [o[HDR_BYTES:HDR_BYTES + nbytes] for o in round1]
        me = members.index(self.rank)
        outs = [mine if i == me else
                scratch.get(f"gather{i}", nbytes, torch.uint8, mine.device) if scratch
                else torch.empty(nbytes, dtype=torch.uint8, device=mine.device)
                for i in range(len(members))]
        pg = self.groups[c]
        if mine.device.type == "cuda":
            self.wait(pg.allgather([outs], [mine]), what, seq, members)
            return outs
        self.pairwise(pg, members, mine, outs, what, seq, tag=1)
        return outs

    def pairwise(self, pg, members, mine, outs, what: str, seq: int, tag: int) -> None:
        """All-gather by point-to-point between the members: Gloo's pairwise transfers run
        at 3-4x the speed of its allgather on loopback here (32 MB between 2 ranks: 24 ms vs
        96 ms), and a header round is one message each way."""
        others = [i for i in range(len(members)) if members[i] != self.rank]
        self._post_and_wait(pg, [(i, mine) for i in others], [(i, outs[i]) for i in others],
                            members, tag, what, seq)

    def all_to_all(self, c: int, src: torch.Tensor, dst: torch.Tensor, what: str,
                   seq: int) -> None:
        """Rail ``c``: part i of ``src`` to member i, part i of ``dst`` from member i (uint8,
        equal parts, sizes proven equal by the header round; this rank's own part is copied).
        CPU: point-to-point (Gloo's pairwise transfers beat its collectives on loopback);
        CUDA: one NCCL all_to_all (separate sends and receives facing each other could
        deadlock on the stream)."""
        members = self.layout.rail(c)
        me, k = members.index(self.rank), len(members)
        per = src.numel() // k
        pg = self.groups[c]
        if src.device.type == "cuda":
            self.wait(pg.alltoall_base(dst, src, [], [], dist.AllToAllOptions()), what, seq,
                       members)
            return
        dst[me * per:(me + 1) * per] = src[me * per:(me + 1) * per]
        others = [i for i in range(k) if i != me]
        self._post_and_wait(pg, [(i, src[i * per:(i + 1) * per]) for i in others],
                            [(i, dst[i * per:(i + 1) * per]) for i in others], members, 1,
                            what, seq)

    def broadcast(self, c: int, buf: torch.Tensor, root: int, round1, what: str, seq: int,
                  nbytes: int) -> None:
        members = self.layout.rail(c)
        ri = members.index(root)
        if nbytes <= SMALL and buf.device.type == "cpu":
            if self.rank != root:
                buf.copy_(round1[ri][HDR_BYTES:HDR_BYTES + nbytes])
            return
        pg = self.groups[c]
        if buf.device.type == "cpu":     # point-to-point from the root (as in pairwise)
            root_sends = self.rank == root
            self._post_and_wait(pg, [(i, buf) for i, m in enumerate(members) if m != root]
                                if root_sends else [], [] if root_sends else [(ri, buf)],
                                members, 1, what, seq)
            return
        opts = dist.BroadcastOptions()
        opts.rootRank = ri
        self.wait(pg.broadcast([buf], opts), what, seq, members)

    #: devices whose blocks to other hosts travel as one all_to_all with split sizes instead of
    #: separate sends and receives (tests add "cpu" to run that path on Gloo)
    grouped_devices: tuple[str, ...] = ("cuda",)

    def sendrecv(self, sends, recvs, what: str, seq: int) -> None:
        """Blocks to and from ranks of other hosts on the world group: ``sends``/``recvs`` are
        ``(global rank, uint8 tensor)``, one per peer at most. CPU: every send and receive
        posted, then waited for (Gloo's point-to-point is its fastest path on loopback).
        CUDA: one NCCL all_to_all with split sizes (zero for the ranks not exchanged with):
        separate sends and receives facing each other on NCCL's stream would deadlock once a
        message outgrows NCCL's buffers, and the all_to_all stays stream-ordered."""
        if self.device not in self.grouped_devices:
            self._post_and_wait(self.world, sends, recvs, range(self.layout.world_size), 0,
                                what, seq)
            return
        sends, recvs = sorted(sends, key=_peer), sorted(recvs, key=_peer)   # rank order
        w = self.layout.world_size
        in_splits, out_splits = [0] * w, [0] * w
        for splits, pairs in ((in_splits, sends), (out_splits, recvs)):
            for p, t in pairs:
                assert not splits[p], f"two blocks for rank {p}"
                splits[p] = t.numel()
        device = (sends + recvs)[0][1].device if sends or recvs else self.device
        src = torch.cat([t for _, t in sends]) if sends else \
            torch.empty(0, dtype=torch.uint8, device=device)
        dst = torch.empty(sum(out_splits), dtype=torch.uint8, device=device)
        peers = sorted({p for p, _ in sends + recvs})
        self.wait(self.world.alltoall_base(dst, src, out_splits, in_splits,
                                            dist.AllToAllOptions()), what, seq, peers)
        off = 0
        for _, t in recvs:
            t.copy_(dst[off:off + t.numel()])
            off += t.numel()

    def _post_and_wait(self, pg, sends, recvs, ranks, tag: int, what: str, seq: int) -> None:
        """Post every send and receive on ``pg`` (``(peer index in pg, uint8 tensor)``; empty
        ones skipped), then wait for each; ``ranks[i]``: peer i's global rank, for errors."""
        works = [(pg.send([t], i, tag), ranks[i]) for i, t in sends if t.numel()]
        works += [(pg.recv([t], i, tag), ranks[i]) for i, t in recvs if t.numel()]
        for w, r in works:
            self.wait(w, what, seq, (r,))

    def wait(self, work, what: str, seq: int, members) -> None:
        """Wait for a torch.distributed ``work``; a failure becomes the stop that caused it or
        ``CommTimeout`` naming the call, its sequence number and the peers."""
        try:
            work.wait()
        except RuntimeError as e:
            stop = self.stopped(what, seq)
            if stop is not None:
                raise stop from None
            others = tuple(m for m in members if m != self.rank)
            raise CommTimeout(f"{what} #{seq}: the inter-host exchange with rank(s) "
                              f"{list(others)} failed (peer died, stopped or timed out after "
                              f"{self.timeout:g} s): {first_line(str(e))}",
                              collective=what, seq=seq, missing=others) from None


def first_line(text: str, limit: int = 400) -> str:
    """The first line of a transport error (Gloo's next lines are its C++ backtrace), cut at
    a word and marked " …" when it is longer than ``limit`` characters."""
    line = text.splitlines()[0] if text else ""
    if len(line) <= limit:
        return line
    cut = line.rfind(" ", 0, limit)
    return line[:cut if cut > 0 else limit] + " …"


def _who(store) -> tuple[int, str, bool] | None:
    """``(by, reason, revoke)`` of the stop recorded in ``store`` (Rails.abort), or None: none
    recorded, or no store to ask."""
    try:
        if not store.check(["who"]):
            return None
        revoke, by, reason = store.get("who").decode().split("|", 2)
    except Exception:  # noqa: BLE001 - the store is gone: not known to be stopped
        return None
    return int(by), reason, revoke == "1"


def _peer(pair) -> int:
    return pair[0]


def _show(idx: int, v: int, what: str) -> str:
    from ..types import DTYPE_BY_ID, OP_BY_ID
    if idx == H_DTYPE and v in DTYPE_BY_ID:
        return DTYPE_BY_ID[v].name
    if idx == H_OP:
        return OP_BY_ID[v].value if v in OP_BY_ID else "none"
    if idx in (H_COLL, H_ALGO):
        return _NAMES.get(v, f"#{v}")
    return str(v)


def _names() -> dict[int, str]:
    from ..algorithms.collectives import COLLECTIVES
    from .plans import REGISTRY
    names = list(COLLECTIVES) + ["send", "recv"] + [a for _, a in REGISTRY]
    return {name_id(n): n for n in names}


class _LazyNames(dict):
    def __missing__(self, key):
        self.update(_names())
        return dict.get(self, key, f"#{key}")

    def get(self, key, default=None):
        return self[key]


_NAMES = _LazyNames()

"""send/recv between ranks of different hosts, over the world Gloo group.

Both sides post, at once, a fixed-size block to the other and a receive for the other's block:
the sender's holds (send, tag, dtype, element count, sequence number) and the data itself when
it fits in :data:`INLINE` bytes; the receiver's holds what it expects. Each side compares the
two blocks and reaches the same verdict, so both raise ``CommMismatch`` on a mismatch (two
receives or two sends facing each other included) without a further message. A small message
is then complete: one exchange, against three messages one after another before (header,
data, acknowledgement). A large one follows as one more message. The blocks' size never
depends on the call, so Gloo never sees a receive of the wrong size; when send returns the
peer is inside the matching recv.
"""

from __future__ import annotations

import numpy as np
import torch

from ..errors import CommMismatch
from ..types import DTYPE_BY_ID, DType
from .rails import SMALL

SEND, RECV = 1, 2
_WORDS = 5   # kind, tag, dtype id, numel, sequence
_HDR = _WORDS * 8
INLINE = SMALL   # payload bytes carried in the sender's block (as in a rail header round)


def send(be, data: torch.Tensor, d: DType, numel: int, peer: int, tag: int) -> None:
    """``data``: the message as a flat uint8 tensor."""
    be.p2p_sent[peer] = seq = be.p2p_sent.get(peer, 0) + 1
    inline = data.numel() <= INLINE
    theirs = _exchange(be, (SEND, tag, d.id, numel, seq), data if inline else None, peer,
                       "send", seq)
    if theirs[0] != RECV or tuple(theirs[1:4]) != (tag, d.id, numel):
        raise CommMismatch(f"send #{seq} to rank {peer} (another host): sent {numel} x {d.name} "
                           f"with tag {tag}, but rank {peer} {_says(theirs)}")
    if not inline:
        _wait(be, _pg(be).send([data], peer, 1), "send", peer, seq)


def recv(be, out: torch.Tensor, d: DType, numel: int, peer: int, tag: int) -> None:
    """``out``: where the message lands, a flat uint8 tensor."""
    be.p2p_recvd[peer] = seq = be.p2p_recvd.get(peer, 0) + 1
    theirs = _exchange(be, (RECV, tag, d.id, numel, seq), None, peer, "recv", seq)
    if theirs[0] != SEND or tuple(theirs[1:4]) != (tag, d.id, numel):
        raise CommMismatch(f"recv #{seq} from rank {peer} (another host): expected {numel} x "
                           f"{d.name} with tag {tag}, but rank {peer} {_says(theirs)}")
    nbytes = out.numel()
    if nbytes > INLINE:
        _wait(be, _pg(be).recv([out], peer, 1), "recv", peer, seq)
    elif nbytes:
        out.copy_(_blocks(be).theirs[_HDR:_HDR + nbytes])


class _Blocks:
    """This rank's two blocks, made once (a fresh tensor per call cost ~25 us of a ~100 us
    exchange here), with numpy views of their header words."""

    def __init__(self):
        self.mine = torch.zeros(_HDR + INLINE, dtype=torch.uint8)
        self.theirs = torch.zeros(_HDR + INLINE, dtype=torch.uint8)
        self.mine_words = self.mine.numpy()[:_HDR].view(np.int64)
        self.theirs_words = self.theirs.numpy()[:_HDR].view(np.int64)


def _blocks(be) -> _Blocks:
    if be.p2p_blocks is None:
        be.p2p_blocks = _Blocks()
    return be.p2p_blocks


def _exchange(be, words, payload, peer: int, what: str, seq: int) -> list[int]:
    """Send this side's block and receive the peer's, concurrently; the peer's words."""
    b = _blocks(be)
    b.mine_words[:] = words
    if payload is not None and payload.numel():
        b.mine[_HDR:_HDR + payload.numel()] = payload
    pg = _pg(be)
    s, r = pg.send([b.mine], peer, 0), pg.recv([b.theirs], peer, 0)
    _wait(be, s, what, peer, seq)
    _wait(be, r, what, peer, seq)
    return b.theirs_words.tolist()


def _says(words: list[int]) -> str:
    kind, tag, did, n = words[:4]
    sd = DTYPE_BY_ID.get(did)
    name = sd.name if sd else f"dtype #{did}"
    if kind == SEND:
        return f"sends {n} x {name} with tag {tag}"
    if kind == RECV:
        return f"is receiving {n} x {name} with tag {tag}"
    return "sent something that is not a point-to-point header"


def _pg(be):
    return be.rails_for("cpu").world


def _wait(be, work, what: str, peer: int, seq: int) -> None:
    be.rails_for("cpu").wait(work, what, seq, (peer,))

"""send/recv between ranks of different hosts, over the world Gloo group.

The sender posts a fixed-size header (tag, dtype, element count), then the data, and waits
for the receiver's one-word verdict: both sides raise ``CommMismatch`` when the header does
not match the receive, and the send returns only once the peer has the message (as between
ranks of one host). The receiver drains a mismatched message into a scratch buffer first, so
Gloo never sees a receive of the wrong size.
"""

from __future__ import annotations

import torch

from ..errors import CommMismatch
from ..types import DTYPE_BY_ID, DType

_WORDS = 4   # tag, dtype id, numel, sequence


def _pg(be):
    return be.rails_for("cpu").world


def _wait(be, work, what: str, peer: int, seq: int) -> None:
    be.rails_for("cpu")._wait(work, what, seq, (peer,))


def send(be, data: torch.Tensor, d: DType, numel: int, peer: int, tag: int) -> None:
    pg = _pg(be)
    be.p2p_sent[peer] = seq = be.p2p_sent.get(peer, 0) + 1
    hdr = torch.tensor([tag, d.id, numel, seq], dtype=torch.int64)
    _wait(be, pg.send([hdr], peer, 0), "send", peer, seq)
    if data.numel():
        _wait(be, pg.send([data], peer, 0), "send", peer, seq)
    ack = torch.zeros(1, dtype=torch.int64)
    _wait(be, pg.recv([ack], peer, 0), "send", peer, seq)
    if int(ack[0]):
        raise CommMismatch(f"send #{seq} to rank {peer} (another host): sent {numel} x {d.name} "
                           f"with tag {tag}, which does not match rank {peer}'s recv")


def recv(be, out: torch.Tensor, d: DType, numel: int, peer: int, tag: int) -> None:
    pg = _pg(be)
    be.p2p_recvd[peer] = seq = be.p2p_recvd.get(peer, 0) + 1
    hdr = torch.zeros(_WORDS, dtype=torch.int64)
    _wait(be, pg.recv([hdr], peer, 0), "recv", peer, seq)
    t, did, n, _ = (int(x) for x in hdr)
    sd = DTYPE_BY_ID.get(did)
    nbytes = n * (sd.itemsize if sd else 1)
    ok = (t, did, n) == (tag, d.id, numel)
    if nbytes:
        sink = out if ok else torch.empty(nbytes, dtype=torch.uint8)
        _wait(be, pg.recv([sink], peer, 0), "recv", peer, seq)
    _wait(be, pg.send([torch.tensor([0 if ok else 1])], peer, 0), "recv", peer, seq)
    if not ok:
        name = sd.name if sd else f"dtype #{did}"
        raise CommMismatch(f"recv #{seq} from rank {peer} (another host): expected {numel} x "
                           f"{d.name} with tag {tag}, but rank {peer} sent {n} x {name} with "
                           f"tag {t}")

"""Point-to-point for the torch backend: send, recv and recv-from-any-source as async work.

``isend`` to a peer that is itself in ``isend`` to us must not block, so transfers run on the
per-(direction, peer) threads of ``work.PairThreads``. Messages between two ranks match in
posting order (Gloo matches by tag). Tags travel with the message and are checked: a recv
posted with another tag than the send it meets raises on both ranks, never delivering the data
to the wrong buffer.
"""

from __future__ import annotations

import threading
import time

import torch

from ..errors import CommError, CommTimeout
from .tensors import Flat
from .work import PairThreads, PendingWork


class PeerTransfers:
    """One process group's sends and recvs over its Communicator ``comm``."""

    def __init__(self, comm, name: str):
        self.comm = comm
        self.threads = PairThreads(name)
        self.closing = False
        self._posted_recvs = [0] * comm.world_size    # recvs from each peer not finished yet
        self._lock = threading.Lock()

    def send(self, t: torch.Tensor, dst: int, tag: int) -> PendingWork:
        src = Flat(t, write=False)
        return PendingWork(self.threads.submit("send", dst, self.comm.send, src.x, dst, tag), [t])

    def recv(self, t: torch.Tensor, src: int, tag: int) -> PendingWork:
        return PendingWork(self._submit_recv(t, src, tag), [t])

    def recv_any(self, t: torch.Tensor, tag: int) -> PendingWork:
        return PendingWork(self.threads.submit("any", -1, self._recv_any, t, tag), [t])

    def shutdown(self) -> None:
        """End waiting transfers (the caller cancels the Communicator's waits) and the threads."""
        self.closing = True
        self.threads.shutdown()

    def _submit_recv(self, t: torch.Tensor, src: int, tag: int):
        """Queue a recv on ``src``'s thread, counted until it ends (see ``_recv_any``)."""
        posted = 0 <= src < len(self._posted_recvs)
        if posted:
            with self._lock:
                self._posted_recvs[src] += 1
        job = self.threads.submit("recv", src, self._recv_into, t, src, tag)
        if posted:
            job.add_done_callback(lambda _: self._recv_done(src))
        return job

    def _recv_done(self, src: int) -> None:
        with self._lock:
            self._posted_recvs[src] -= 1

    def _recv_into(self, t: torch.Tensor, src: int, tag: int = 0) -> int:
        dst = Flat(t, read=False)
        self.comm.recv(dst.x, src, tag)
        dst.finish()
        return src

    def _recv_any(self, t: torch.Tensor, tag: int = 0) -> int:
        """Wait (bounded) for the first peer with a message waiting that no recv already
        posted for that peer will take (a sender has one message in flight per pair), then
        receive it on that peer's recv thread, so it stays in order with later recvs."""
        comm = self.comm
        peers = [p for p in range(comm.world_size) if p != comm.rank]
        deadline = time.monotonic() + comm.timeout
        while True:
            if self.closing:
                raise CommError("recv from any source: cancelled: the process group was "
                                "destroyed")
            for p in peers:
                if self._posted_recvs[p] == 0 and comm.probe(p):
                    return self._submit_recv(t, p, tag).result()
            if time.monotonic() > deadline:
                raise CommTimeout(f"recv from any source: no rank of {peers} sent a message "
                                  f"within {comm.timeout:.1f} s", collective="recv")
            time.sleep(20e-6)

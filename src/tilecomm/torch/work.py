"""Work objects handed back to torch.distributed, and the threads that make send/recv async.

Collectives run to completion inside the call (every rank is in the call anyway), so their
work is born finished. Point-to-point is different: ``isend`` to a peer that is itself in
``isend`` to us must not block, so each (direction, peer) pair gets one worker thread that
runs that pair's transfers in posting order. Order per pair is what MPI and Gloo promise
(messages between two ranks do not overtake each other); pairs progress independently.
"""

from __future__ import annotations

import concurrent.futures as cf
import threading

import torch
import torch.distributed as dist
from torch.futures import Future


class DoneWork(dist.Work):
    """The work of a call that has already completed (or already failed)."""

    def __init__(self, result: list[torch.Tensor], source_rank: int = -1):
        super().__init__()
        self._result = result
        self._src = source_rank
        self._fut: Future | None = None    # made when asked for: most callers never do

    def wait(self, timeout=None) -> bool:  # noqa: ARG002 - nothing left to wait for
        return True

    def is_completed(self) -> bool:
        return True

    def is_success(self) -> bool:
        return True

    def exception(self):
        return None

    def result(self) -> list[torch.Tensor]:
        return self._result

    def source_rank(self) -> int:
        return self._src

    def _source_rank(self) -> int:
        return self._src

    def get_future(self) -> Future:
        if self._fut is None:
            self._fut = Future()
            self._fut.set_result(self._result)
        return self._fut

    def synchronize(self) -> None:
        return None


class PendingWork(dist.Work):
    """The work of a send or recv running on its pair's thread.

    ``wait`` re-raises the transfer's error (a :class:`~tilecomm.CommError` naming the peer and
    message number). The transfer's own bounded waits end it; ``wait(timeout)`` only bounds how
    long this caller blocks.
    """

    def __init__(self, job: cf.Future, result: list[torch.Tensor]):
        super().__init__()
        self._job = job
        self._result = result
        self._fut: Future = Future()
        job.add_done_callback(self._finish)

    def _finish(self, job: cf.Future) -> None:
        exc = job.exception()
        if exc is not None:
            self._fut.set_exception(exc)
        else:
            self._fut.set_result(self._result)

    def wait(self, timeout=None) -> bool:
        seconds = None
        if timeout is not None and hasattr(timeout, "total_seconds") and timeout.total_seconds() > 0:
            seconds = timeout.total_seconds()
        try:
            self._job.result(timeout=seconds)
        except cf.TimeoutError:
            raise TimeoutError(f"tilecomm: point-to-point work not finished within {seconds} s "
                               f"(the transfer keeps running until its own timeout)") from None
        return True

    def is_completed(self) -> bool:
        return self._job.done()

    def is_success(self) -> bool:
        return self._job.done() and self._job.exception() is None

    def exception(self):
        return self._job.exception() if self._job.done() else None

    def result(self) -> list[torch.Tensor]:
        self.wait()
        return self._result

    def source_rank(self) -> int:
        self.wait()
        return int(self._job.result())

    def _source_rank(self) -> int:
        return self.source_rank()

    def get_future(self) -> Future:
        return self._fut

    def synchronize(self) -> None:
        return None


class PairThreads:
    """One single-thread executor per (direction, peer): transfers of a pair stay in order."""

    def __init__(self, name: str):
        self._name = name
        self._pools: dict[tuple[str, int], cf.ThreadPoolExecutor] = {}
        self._lock = threading.Lock()

    def submit(self, direction: str, peer: int, fn, *args) -> cf.Future:
        key = (direction, peer)
        with self._lock:
            pool = self._pools.get(key)
            if pool is None:
                pool = cf.ThreadPoolExecutor(1, thread_name_prefix=f"{self._name}-{direction}{peer}")
                self._pools[key] = pool
        return pool.submit(fn, *args)

    def shutdown(self) -> None:
        with self._lock:
            pools, self._pools = list(self._pools.values()), {}
        for pool in pools:
            pool.shutdown(wait=True, cancel_futures=True)

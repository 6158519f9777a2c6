"""A group of ranks on simulated hosts that runs functions like :class:`~tilecomm.RankGroup`.

``tilecomm bench ... --hosts 2`` uses it: every rank is a torchrun worker on a simulated host
(``tilecomm.simhosts``) holding a communicator from ``tilecomm.init()``; the launcher sends it
``(fn, args)`` over a local authenticated connection (127.0.0.1) and collects one result per
rank, in rank order, as ``RankGroup.run`` does.
"""

from __future__ import annotations

import secrets
import sys
import time
from multiprocessing.connection import Client, Listener

from ..errors import RankError
from .. import simhosts


class HostsGroup:
    def __init__(self, per_host: list[int], *, timeout: float, heap_bytes: int | None = None,
                 deterministic: bool = False):
        self.per_host = list(per_host)
        self.world_size = sum(self.per_host)
        self.timeout = timeout
        self.heap_bytes = heap_bytes
        self.deterministic = deterministic
        self.procs = []
        self.conns: list = []

    def __enter__(self) -> "HostsGroup":
        key = secrets.token_bytes(16)
        listener = Listener(("127.0.0.1", 0), authkey=key)
        host, port = listener.address
        argv = ["-m", "tilecomm.bench.hosts_group", f"{host}:{port}", key.hex(),
                str(self.timeout), str(self.heap_bytes or 0), str(int(self.deterministic))]
        import threading

        by_rank: dict = {}

        def accept_all():
            try:
                while len(by_rank) < self.world_size:
                    conn = listener.accept()
                    by_rank[conn.recv()] = conn
            except OSError:
                pass            # the listener was closed: startup gave up

        try:
            # each host's tmpfs holds its ranks' heaps (2 GiB unless they need more)
            need = max(self.per_host) * ((self.heap_bytes or 0) + (256 << 20))
            self.procs = simhosts.start(self.per_host, argv, shm_size=max(need, 2 << 30))
            t = threading.Thread(target=accept_all, daemon=True)
            t.start()
            end = time.monotonic() + max(60.0, self.timeout)
            while t.is_alive() and time.monotonic() < end:
                if any(p.poll() not in (None, 0) for p in self.procs):
                    break
                t.join(0.1)
            if len(by_rank) < self.world_size:
                raise RankError(min(set(range(self.world_size)) - set(by_rank)), "exit",
                                "the rank did not start on its simulated host (see the "
                                "torchrun output above)")
            self.conns = [by_rank[r] for r in range(self.world_size)]
        except BaseException:
            listener.close()
            self.stop()
            raise
        listener.close()
        return self

    def run(self, fn, *args) -> list:
        """``fn(comm, *args)`` on every rank; results in rank order. A rank that raises makes
        this raise :class:`RankError` for the lowest such rank, after every rank's reply has
        been read, so the next ``run`` gets its own replies, not this one's. A rank that sends
        no reply within ``timeout`` + 30 s, or dies, stops the whole group (a late reply
        would be taken for the next call's), and this raises."""
        if not self.conns:
            raise RuntimeError("HostsGroup: the group is stopped (a rank timed out or died)")
        for c in self.conns:
            c.send((fn, args))
        out, first = [], None
        for r, c in enumerate(self.conns):
            try:
                if not c.poll(self.timeout + 30):
                    self.stop()
                    raise first or RankError(r, "CommTimeout", "no result from the rank")
                status, *rest = c.recv()
            except (EOFError, OSError):
                self.stop()
                raise first or RankError(r, "exit", "the rank's process ended before "
                                         "returning (see the torchrun output above)") from None
            if status != "ok":
                first = first or RankError(r, *rest)
                continue
            out.append(rest[0])
        if first is not None:
            raise first
        return out

    def stop(self) -> None:
        for c in self.conns:
            try:
                c.send(None)
                c.close()
            except OSError:
                pass
        self.conns = []
        end = time.monotonic() + 15
        while self.procs and time.monotonic() < end and any(p.poll() is None for p in self.procs):
            time.sleep(0.05)
        simhosts.stop(self.procs)
        self.procs = []

    def __exit__(self, *exc) -> None:
        self.stop()


def _worker(address: str, key: str, timeout: str, heap_bytes: str, deterministic: str) -> None:
    """A torchrun worker: a communicator over every host, then tasks from the launcher."""
    import pickle
    import traceback

    import torch

    import tilecomm

    torch.set_num_threads(1)
    comm = tilecomm.init(timeout=float(timeout), heap_bytes=int(heap_bytes) or None,
                         deterministic=bool(int(deterministic)))
    host, port = address.rsplit(":", 1)
    conn = Client((host, int(port)), authkey=bytes.fromhex(key))
    conn.send(comm.rank)
    try:
        while True:
            data = conn.recv_bytes()
            try:
                task = pickle.loads(data)
                if task is None:
                    break
                fn, args = task
                conn.send(("ok", fn(comm, *args)))
            except BaseException as e:  # noqa: BLE001 - reported to the launcher
                conn.send(("err", type(e).__name__, str(e), traceback.format_exc()))
    finally:
        try:
            import torch.distributed as dist
            if dist.is_initialized():
                dist.destroy_process_group()
        except Exception:  # noqa: BLE001
            pass
        comm.close()


if __name__ == "__main__":
    _worker(*sys.argv[1:6])

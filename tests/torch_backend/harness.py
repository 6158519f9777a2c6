"""Run a function on N forked ranks inside a torch.distributed process group."""

from __future__ import annotations

import multiprocessing as mp
import os
import tempfile
import traceback
from datetime import timedelta


def _rank_body(fn, rank, world, backend, path, timeout, q):
    try:
        import torch
        import torch.distributed as dist

        import tilecomm  # noqa: F401 - registers the backend

        torch.set_num_threads(1)
        dist.init_process_group(backend, init_method=f"file://{path}", rank=rank,
                                world_size=world, timeout=timedelta(seconds=timeout))
        try:
            result = fn(rank, world)
        finally:
            dist.destroy_process_group()
        q.put((rank, "ok", result))
    except BaseException as e:  # noqa: BLE001 - reported to the test
        q.put((rank, "error", f"{type(e).__name__}: {e}\n{traceback.format_exc()}"))


def run_ranks(fn, world: int, backend: str = "tilecomm", timeout: float = 30.0,
              wait: float = 90.0) -> list:
    """``fn(rank, world)`` on ``world`` forked ranks; results by rank (picklable values).

    A rank that raises gives ``("error", text)`` in its slot; nothing is left running.
    """
    ctx = mp.get_context("fork")
    q = ctx.Queue()
    fd, path = tempfile.mkstemp(prefix="tilecomm-pg-")
    os.close(fd)
    os.unlink(path)   # FileStore creates it
    procs = [ctx.Process(target=_rank_body, args=(fn, r, world, backend, path, timeout, q))
             for r in range(world)]
    for p in procs:
        p.start()
    out: list = [None] * world
    try:
        for _ in procs:
            rank, status, value = q.get(timeout=wait)
            out[rank] = value if status == "ok" else ("error", value)
    finally:
        for p in procs:
            p.join(timeout=5)
            if p.is_alive():
                p.kill()
                p.join()
        if os.path.exists(path):
            os.unlink(path)
    return out

"""Where this test process's ranks put their shared-memory segments, and which are there now.

Under pytest-xdist each worker gets a directory of its own under /dev/shm (set as
TILECOMM_SHM_DIR by conftest.py before tilecomm reads its settings), so that a leak check sees
its own worker's segments only, not those of the worker running beside it."""

from __future__ import annotations

import os
import re
import shutil


def shm_dir() -> str:
    return os.environ.get("TILECOMM_SHM_DIR") or "/dev/shm"


def tilecomm_files(directory: str | None = None) -> set[str]:
    """The tilecomm segment and probe files in ``directory`` (default :func:`shm_dir`: this
    worker's; ``"/dev/shm"``: the machine's) now; none where the directory does not exist."""
    try:
        return {f for f in os.listdir(directory or shm_dir()) if f.startswith("tilecomm")}
    except FileNotFoundError:
        return set()


def worker_dir_prefix(worker: str) -> str:
    """The name prefix of an xdist worker's segment directory: its name and pid."""
    return f"tilecomm-tests-{worker}-{os.getpid()}-"


def remove_stale_worker_dirs() -> list[str]:
    """Remove the segment directories of test workers that are gone (killed, crashed: their
    session never ended); returns them."""
    gone = []
    for name in os.listdir("/dev/shm"):
        m = re.fullmatch(r"tilecomm-tests-gw\d+-(\d+)-.+", name)
        if m and not os.path.exists(f"/proc/{m.group(1)}"):
            shutil.rmtree(os.path.join("/dev/shm", name), ignore_errors=True)
            gone.append(name)
    return gone

"""Where this test process's ranks put their shared-memory segments, and which are there now.

Under pytest-xdist each worker gets a directory of its own under /dev/shm (set as
TILECOMM_SHM_DIR by conftest.py before tilecomm reads its settings), so that a leak check sees
its own worker's segments only, not those of the worker running beside it."""

from __future__ import annotations

import os


def shm_dir() -> str:
    return os.environ.get("TILECOMM_SHM_DIR") or "/dev/shm"


def tilecomm_files(directory: str | None = None) -> set[str]:
    """The tilecomm segment and probe files in ``directory`` (default :func:`shm_dir`: this
    worker's; ``"/dev/shm"``: the machine's) now; none where the directory does not exist."""
    try:
        return {f for f in os.listdir(directory or shm_dir()) if f.startswith("tilecomm")}
    except FileNotFoundError:
        return set()

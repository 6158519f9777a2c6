"""Rank processes end with their launcher, however it ends (issue 12, gap 1).

A launcher killed by SIGTERM, SIGHUP or SIGKILL runs no cleanup, and its ranks used to live on
(PPID 1) until the user's function returned, which a training loop never does. Two guards, both
set up inside the rank process:

* a watchdog thread polls ``os.getppid()`` every ``POLL`` seconds; once the parent is gone it
  unlinks the segment files (they still exist only while the ranks are starting, see
  ``heap/shm.py``) and ends the process. It needs the GIL, which a rank busy in Python code or
  in a torch/numpy call (they release it) gives up every few milliseconds.
* on Linux, ``prctl(PR_SET_PDEATHSIG, SIGKILL)``: the kernel kills the rank when its parent
  thread exits, even in a C call that holds the GIL. It fires when the *thread* that started
  the rank exits, so it is armed only when that was the launcher's main thread, and only after
  the segment files are gone (a kill cannot unlink them).
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys
import threading
from typing import Callable, Sequence

#: seconds between two checks of the parent (the rank ends at most this long after it)
POLL = 0.1
_PR_SET_PDEATHSIG = 1


def watch_parent(parent_pid: int | None, cleanup: Callable[[], None] = lambda: None) -> None:
    """Start the watchdog thread of this rank process.

    ``parent_pid``: the launcher's pid when it is this process's parent (fork, spawn); a
    different parent at start means the launcher already died. ``None`` (forkserver: the
    parent is the fork server, which exits with the launcher): watch the parent found now.
    ``cleanup`` runs before the process ends (it must not raise).
    """
    parent = os.getppid() if parent_pid is None else parent_pid

    def loop() -> None:
        stop = threading.Event()
        while os.getppid() == parent:
            stop.wait(POLL)
        try:
            cleanup()
        finally:
            os._exit(128 + signal.SIGHUP)   # as a shell's hang-up would end it

    threading.Thread(target=loop, name="tilecomm-parent-watch", daemon=True).start()


def die_with_parent_thread() -> bool:
    """Ask the kernel to SIGKILL this process when its parent thread exits (Linux only);
    returns whether it was armed."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(_PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def unlink_all(paths: Sequence[str]) -> Callable[[], None]:
    """A cleanup that removes ``paths`` (missing ones are fine)."""
    from .heap.shm import unlink_quietly

    def run() -> None:
        for p in paths:
            try:
                unlink_quietly(p)
            except OSError:
                pass

    return run

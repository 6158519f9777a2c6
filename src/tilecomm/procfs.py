"""What Linux says of another process (``/proc/PID/stat``): its state and its parent.

One reading for the places that ask: a wait checking that its peers live
(``backends/cpu/channel.py``), the launcher and the flight recorder looking for stopped
ranks, and ``torchrun.kill_this_host`` finding the ranks of its agent.
"""

from __future__ import annotations

#: states of a process that has ended (zombie, dead) and of a stopped one (SIGSTOP, traced)
ENDED = (b"Z", b"X")
STOPPED = (b"T", b"t")


def _fields(pid: int) -> list[bytes] | None:
    """The fields of ``/proc/PID/stat`` after the command name (which may hold spaces and
    parentheses): state, ppid, ...; None when the process is gone; [] when it cannot be read."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[1].split() or None
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return None
    except OSError:
        return []


def state(pid: int) -> bytes | None:
    """The one-letter state of process ``pid`` (b"R", b"S", b"T", b"Z", ...); None when it is
    gone, b"" when it cannot be read."""
    f = _fields(pid)
    return None if f is None else (f[0] if f else b"")


def parent(pid: int) -> int:
    """The parent of process ``pid``, or -1 when it is gone or cannot be read."""
    f = _fields(pid)
    try:
        return int(f[1]) if f else -1
    except (ValueError, IndexError):
        return -1

"""Single-copy reads of a peer process's memory (Linux cross-memory attach).

``process_vm_readv`` copies bytes from another process's address space into ours in one pass,
inside the kernel. With it a peer reads a rank's ordinary tensor where it lies instead of the
rank first staging it into shared memory: two_shot all_reduce then moves about 2.5 N bytes
per rank instead of 4 N, which is what puts Open MPI's vader transport ahead on messages too
large for the cache. It needs the same rights as ptrace: the same user and, under Yama's
ptrace_scope 1, the reader named as a permitted tracer, which :func:`allow_peers` arranges
(``PR_SET_PTRACER_ANY``, as Open MPI does). Whether it works is probed at communicator start
(the kernel, a seccomp filter or a container may forbid it); ``TILECOMM_CMA=0`` turns it off.

This module is the Python path's access (ctypes: the package must work without its compiled
runner); ``_native.c`` makes the same call.
"""

from __future__ import annotations

import ctypes
import os
import sys

#: what a rank publishes in SegmentLayout.CMA after its start-up probe (0: not yet)
SINGLE_COPY_YES, SINGLE_COPY_NO, SINGLE_COPY_OVERSUBSCRIBED = 1, 2, 3

_PR_SET_PTRACER = 0x59616D61
_PR_SET_PTRACER_ANY = ctypes.c_ulong(-1).value


class _IoVec(ctypes.Structure):
    _fields_ = [("base", ctypes.c_void_p), ("len", ctypes.c_size_t)]


_libc = None
if sys.platform.startswith("linux"):
    try:
        _libc = ctypes.CDLL(None, use_errno=True)
        _libc.process_vm_readv.argtypes = [ctypes.c_int, ctypes.POINTER(_IoVec), ctypes.c_ulong,
                                           ctypes.POINTER(_IoVec), ctypes.c_ulong,
                                           ctypes.c_ulong]
        _libc.process_vm_readv.restype = ctypes.c_ssize_t
    except (OSError, AttributeError):    # no such call in this C library
        _libc = None


def supported() -> bool:
    """Whether this platform has ``process_vm_readv`` at all (Linux 3.2+)."""
    return _libc is not None


def allow_peers() -> None:
    """Let processes of the same user read this one (Yama ptrace_scope 1 allows only
    ancestors otherwise). No effect, and no error, where Yama is absent."""
    if _libc is not None:
        _libc.prctl(_PR_SET_PTRACER, _PR_SET_PTRACER_ANY, 0, 0, 0)


def read_into(pid: int, remote_addr: int, local_addr: int, nbytes: int) -> None:
    """Copy ``nbytes`` at ``remote_addr`` in process ``pid`` to ``local_addr`` here; OSError
    (with the errno) when the kernel refuses or the range is not mapped there."""
    done = 0
    local, remote = _IoVec(), _IoVec()
    while done < nbytes:
        local.base, local.len = local_addr + done, nbytes - done
        remote.base, remote.len = remote_addr + done, nbytes - done
        got = _libc.process_vm_readv(pid, ctypes.byref(local), 1, ctypes.byref(remote), 1, 0)
        if got <= 0:
            err = ctypes.get_errno() if got < 0 else 0
            raise OSError(err, f"process_vm_readv from pid {pid} at {remote_addr + done:#x} "
                               f"({nbytes - done} bytes): {os.strerror(err) if err else 'no progress'}")
        done += got


def probe(pid: int, remote_addr: int, expected: bytes) -> bool:
    """Whether ``len(expected)`` bytes read at ``remote_addr`` in ``pid`` equal ``expected``."""
    if _libc is None:
        return False
    buf = ctypes.create_string_buffer(len(expected))
    try:
        read_into(pid, remote_addr, ctypes.addressof(buf), len(expected))
    except OSError:
        return False
    return buf.raw == expected


__all__ = ["SINGLE_COPY_NO", "SINGLE_COPY_OVERSUBSCRIBED", "SINGLE_COPY_YES", "allow_peers",
           "probe", "read_into", "supported"]

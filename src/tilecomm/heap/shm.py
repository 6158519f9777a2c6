"""POSIX shared-memory heap for ranks on one host (every CPU test and CI run uses it).

Segment files are created with mode 0600 and unpredictable names (``tilecomm-<random>``). Each
file is unlinked as soon as every rank has mapped it: from then on the memory lives only in the
mappings, so nothing is left in ``/dev/shm`` however the processes end (raise, exit, SIGKILL).
Until then the creator (launcher, or the rank under torchrun) unlinks on error.
"""

from __future__ import annotations

import mmap
import os
import secrets
import weakref

import numpy as np

from .base import SegmentLayout, SymmetricHeap

PREFIX = "tilecomm-"


def create_segment_file(shm_dir: str, nbytes: int) -> str:
    """Create a private (0600) segment file of ``nbytes`` (sparse) and return its path."""
    if not os.path.isdir(shm_dir):
        raise FileNotFoundError(f"the shared-memory directory {shm_dir!r} (TILECOMM_SHM_DIR) "
                                f"does not exist or is not a directory; point TILECOMM_SHM_DIR "
                                f"at an existing tmpfs directory such as /dev/shm")
    free = _free_bytes(shm_dir)
    for _ in range(16):
        path = os.path.join(shm_dir, PREFIX + secrets.token_hex(12))
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        except FileExistsError:
            continue
        try:
            os.ftruncate(fd, nbytes)
        except OSError:
            os.close(fd)
            os.unlink(path)
            raise
        os.close(fd)
        if free is not None and free < nbytes // 8:
            # Pages are allocated on touch; a full tmpfs turns a touch into SIGBUS, so warn early.
            import warnings
            warnings.warn(f"{shm_dir} has {free >> 20} MiB free for a {nbytes >> 20} MiB "
                          f"segment; collectives may fail (lower TILECOMM_HEAP_BYTES)")
        return path
    raise RuntimeError(f"could not create a unique segment file in {shm_dir}")


def unlink_quietly(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


def _free_bytes(d: str) -> int | None:
    try:
        st = os.statvfs(d)
    except OSError:
        return None
    return st.f_bavail * st.f_frsize


class ShmHeap(SymmetricHeap):
    """Maps the segment files of all ranks; ``rank`` owns ``paths[rank]``."""

    def __init__(self, rank: int, layout: SegmentLayout, paths: list[str]):
        if len(paths) != layout.world_size:
            raise ValueError(f"need {layout.world_size} segment paths, got {len(paths)}")
        self.rank, self.world_size, self.layout = rank, layout.world_size, layout
        self.paths = list(paths)
        self._maps: list[mmap.mmap] = []
        self._segs: list[np.ndarray] = []
        self._slots: list[memoryview] = []
        #: ``[lo, hi)`` of this rank's own segment while it is mapped (None once released)
        self.own_range: tuple[int, int] | None = None
        self._own_map = None            # after close, while tensors keep the mapping: its ref
        try:
            for p in paths:
                fd = os.open(p, os.O_RDWR | os.O_NOFOLLOW)
                try:
                    size = os.fstat(fd).st_size
                    if size != layout.total_bytes:
                        raise RuntimeError(f"segment {p} has {size} bytes, expected "
                                           f"{layout.total_bytes}: ranks were started with "
                                           f"different heap settings")
                    m = mmap.mmap(fd, size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
                finally:
                    os.close(fd)
                self._maps.append(m)
                self._segs.append(np.frombuffer(m, dtype=np.uint8))
                if len(self._segs) == rank + 1:
                    lo = self._segs[-1].ctypes.data
                    self.own_range = (lo, lo + size)
                self._slots.append(memoryview(m)[: layout.num_slots * 8].cast("q"))
        except BaseException:
            self.close()
            raise

    @property
    def mapped(self) -> bool:
        """True while this rank's own segment is mapped (open, or closed while tensors still
        pointed into it and they are not all gone)."""
        if self.own_range is None:
            return False
        return bool(self._maps) or (self._own_map is not None and self._own_map() is not None)

    def maps(self, address: int) -> bool:
        """True when ``address`` lies in this rank's own segment and it is still mapped."""
        r = self.own_range
        return r is not None and r[0] <= address < r[1] and self.mapped

    def segment(self, rank: int) -> np.ndarray:
        return self._segs[rank]

    def slots(self, rank: int) -> memoryview:
        return self._slots[rank]

    def block(self, rank: int, offset: int, nbytes: int) -> np.ndarray:
        """A uint8 array over ``[offset, offset + nbytes)`` of ``rank``'s segment that owns its
        own buffer export, so views of it keep it (and a finalizer on it) alive."""
        return np.frombuffer(memoryview(self._maps[rank])[offset:offset + nbytes], np.uint8)

    def unlink(self) -> None:
        """Remove this rank's segment file (the mappings stay valid)."""
        unlink_quietly(self.paths[self.rank])

    def close(self) -> None:
        for s in self._slots:
            s.release()
        self._slots.clear()
        self._segs.clear()
        for i, m in enumerate(self._maps):
            try:
                m.close()
                if i == self.rank:
                    self.own_range = None       # the addresses may be reused from now on
            except BufferError:
                # A tensor returned by comm.alloc still points into the segment: leave the
                # mapping to the OS (released at exit), never invalidate live memory. It
                # goes when the last such tensor does (the mmap object is collected then).
                if i == self.rank:
                    self._own_map = weakref.ref(m)
        self._maps.clear()

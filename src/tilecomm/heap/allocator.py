"""First-fit allocator over the user part of the symmetric heap.

Deterministic: ranks that allocate and free the same sizes in the same order get the same
offsets, which is what makes the heap symmetric. ``comm.alloc`` checks that they did.
"""

from __future__ import annotations

from .base import ALIGN, round_up


class HeapAllocator:
    def __init__(self, base: int, size: int):
        self.base, self.size = base, size
        self._free: list[tuple[int, int]] = [(base, size)]   # sorted (offset, length)
        self._used: dict[int, int] = {}

    def alloc(self, nbytes: int) -> int:
        """Offset of a fresh block of at least ``nbytes`` (``MemoryError`` when full)."""
        need = round_up(max(nbytes, 1), ALIGN)
        for i, (off, length) in enumerate(self._free):
            if length >= need:
                if length == need:
                    del self._free[i]
                else:
                    self._free[i] = (off + need, length - need)
                self._used[off] = need
                return off
        largest = max((ln for _, ln in self._free), default=0)
        raise MemoryError(f"symmetric heap exhausted: asked for {nbytes} bytes, largest free "
                          f"block is {largest} of {self.size}; raise TILECOMM_HEAP_BYTES or "
                          f"heap_bytes=")

    def free(self, off: int) -> None:
        length = self._used.pop(off)
        self._free.append((off, length))
        self._free.sort()
        merged: list[tuple[int, int]] = []
        for o, ln in self._free:
            if merged and merged[-1][0] + merged[-1][1] == o:
                merged[-1] = (merged[-1][0], merged[-1][1] + ln)
            else:
                merged.append((o, ln))
        self._free = merged

    @property
    def bytes_in_use(self) -> int:
        return sum(self._used.values())

    def blocks(self) -> list[tuple[int, int]]:
        """The live allocations as ``(offset, bytes)``, by offset."""
        return sorted(self._used.items())

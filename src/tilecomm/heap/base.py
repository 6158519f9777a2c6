"""The heap interface and the byte layout of one rank's symmetric segment.

Every rank owns one segment of identical layout; peers map it, so an offset names the same
object on every rank (``comm.peer(t, r)`` is just "same offset, rank r's segment")::

    +---------+------------------+-------------------------+---------------------+
    | control | p2p mailboxes    | scratch (2 halves)      | user heap           |
    | flags,  | one slot per     | staging for tensors     | comm.alloc tensors  |
    | descrs  | destination rank | outside the heap        |                     |
    +---------+------------------+-------------------------+---------------------+

The control block holds int64 slots written only by the owner (peers only read them), so a
single aligned 8-byte store publishes a flag; x86-64 keeps stores in order (TSO), so data written
before a flag is visible to a peer that sees the flag.
"""

from __future__ import annotations

import abc
from dataclasses import dataclass

import numpy as np

ALIGN = 256


def round_up(n: int, a: int = ALIGN) -> int:
    return (n + a - 1) // a * a


@dataclass(frozen=True)
class SegmentLayout:
    """Byte offsets inside each rank's segment (identical on every rank)."""

    world_size: int
    scratch_bytes: int
    heap_bytes: int
    p2p_slot_bytes: int = 4 << 20

    # int64 slot indices in the control block
    PROGRESS = 0          # collective step counter (monotonic)
    PID = 1
    ABORT = 2             # 1 + sequence number of the collective this rank gave up on
    #: what the rank is doing now (for peers' mismatch checks and timeout messages; see NOTE
    #: [activity] in backends/cpu/channel.py): ACT_KIND 0 idle, 1 collective, 2 send, 3 recv;
    #: ACT_PEER the collective's id or the p2p peer; ACT_NUM its sequence or message number
    ACT_KIND, ACT_PEER, ACT_NUM = 3, 4, 5
    #: whether this rank could read every peer's memory with process_vm_readv (probed at
    #: start, backends/cpu/cma.py): 0 not yet known, 1 yes, 2 no (or TILECOMM_CMA=0), 3 not
    #: used: more ranks than CPUs
    CMA = 6
    #: the address of this rank's segment in its own process (where the CMA probe reads)
    SELF_ADDR = 7
    DESC = 8              # two descriptors (by seq parity), DESC_LEN slots each
    DESC_LEN = 20

    @property
    def rows(self) -> int:
        """First slot of the all_to_all_v count rows: 2 parities x (send row, recv row)."""
        return self.DESC + 2 * self.DESC_LEN

    def row_slot(self, parity: int, which: int) -> int:
        return self.rows + (parity * 2 + which) * self.world_size

    @property
    def p2p(self) -> int:
        """First slot of the p2p counters: 5 arrays of world_size slots."""
        return self.rows + 4 * self.world_size

    def p2p_slot(self, array: int, peer: int) -> int:
        # arrays: 0 sent_to[dst], 1 done_from[src], 2 err_from[src], 3 err_dtype, 4 err_numel
        return self.p2p + array * self.world_size + peer

    @property
    def stop(self) -> int:
        """First of the six slots of the stop word and the shrink agreement
        (backends/cpu/channel.py, NOTE [stop word]; ``STOP_*`` offsets from it)."""
        return self.p2p + 5 * self.world_size

    #: offsets from ``stop``: how the rank stopped the communicator (0 not, 1 aborted, 2
    #: revoked), the bytes of its reason (the third message area), the sequence number of
    #: its last call then; its shrink vote ``attempt << 32 | crc32(exclude list)`` (one word,
    #: so a vote is never read with another attempt's list), its exclude list as a bit mask
    #: (for the messages), and (lowest survivor) ``attempt << 32 | port`` of the rendezvous;
    #: then the device abort word, the one slot other ranks write (1 + the rank that aborted;
    #: polled by this rank's device waits: NOTE [device abort] in device/heap.py), and 1 + the
    #: rank (of the whole communicator, across hosts) that stopped it (this one, or the one
    #: whose stop it relays)
    (STOP_KIND, STOP_LEN, STOP_SEQ, SHRINK_VOTE, SHRINK_EXCLUDE, SHRINK_PORT,
     DEVICE_ABORT, STOP_BY) = range(8)

    @property
    def num_slots(self) -> int:
        return self.stop + 8

    MSG_BYTES = 512       # error text per parity (and the stop reason, a third area)

    @property
    def msg_offset(self) -> int:
        return round_up(self.num_slots * 8)

    @property
    def control_bytes(self) -> int:
        return round_up(self.msg_offset + 3 * self.MSG_BYTES, 4096)

    @property
    def p2p_offset(self) -> int:
        return self.control_bytes

    def p2p_data(self, dst: int) -> int:
        return self.p2p_offset + dst * self.p2p_slot_bytes

    @property
    def scratch_offset(self) -> int:
        return round_up(self.p2p_offset + self.world_size * self.p2p_slot_bytes, 4096)

    def scratch_half(self, parity: int) -> int:
        return self.scratch_offset + parity * (self.scratch_bytes // 2)

    @property
    def heap_offset(self) -> int:
        return round_up(self.scratch_offset + self.scratch_bytes, 4096)

    @property
    def total_bytes(self) -> int:
        return round_up(self.heap_offset + self.heap_bytes, 4096)


class SymmetricHeap(abc.ABC):
    """One segment per rank, all mapped by every rank.

    ``segment(r)`` is rank ``r``'s whole segment as a ``uint8`` numpy array; ``slots(r)`` its
    control block as a memoryview of int64 (fast scalar reads for polling).
    """

    rank: int
    world_size: int
    layout: SegmentLayout

    @abc.abstractmethod
    def segment(self, rank: int) -> np.ndarray: ...

    @abc.abstractmethod
    def slots(self, rank: int) -> memoryview: ...

    @abc.abstractmethod
    def block(self, rank: int, offset: int, nbytes: int) -> np.ndarray:
        """``[offset, offset + nbytes)`` of ``rank``'s segment as an array that is the base of
        every view taken from it (so a finalizer on it runs when the last view dies)."""

    @abc.abstractmethod
    def close(self) -> None: ...

    def offset_of(self, array: np.ndarray) -> int | None:
        """Byte offset of ``array``'s data in this rank's segment, or None if outside it."""
        seg = self.segment(self.rank)
        base = seg.ctypes.data
        ptr = array.ctypes.data if isinstance(array, np.ndarray) else int(array)
        if base <= ptr < base + seg.nbytes:
            return ptr - base
        return None

"""The device handle: everything a kernel needs to reach its peers, in one int64 tensor.

A kernel that communicates takes one argument for it, ``heap`` (``DeviceHeap.handle``, a
pointer to int64 on the kernel's device), instead of the four it took before (the peer base
table, the rank, the error buffer and the wait bound). The device-API functions of
:mod:`tilecomm.device.lang` take it too and read what they need.

Layout (int64 words)::

    RANK         this rank
    WORLD        ranks in the heap
    TIMEOUT_NS   how long a device wait polls before it gives up (DeviceHeap.timeout)
    SELF_BASE    this rank's heap base (BASES + RANK, kept apart so that translating a
                 pointer needs no load that waits on the load of the rank)
    ABORT        where this rank's abort word is, in int64 words from the handle itself
                 (``heap + handle[ABORT]``): a word in this rank's symmetric memory that any
                 rank's ``comm.abort()`` sets, and every device wait polls (NOTE [device
                 abort] in device/heap.py); by default the handle's own word NO_ABORT,
                 which stays zero
    (5..7)       reserved, zero (5 = NO_ABORT)
    ERR ..       the error record of bounded waits, ERR_WORDS words (tilecomm.device.errors;
                 ``DeviceHeap.errors`` is a view of them)
    BASES ..     every rank's heap base address, as mapped in this process, WORLD words
                 (``DeviceHeap.bases`` is a view of them)

Why data, not arguments: the rank, the timeout and the bases are the same for every launch of
a heap's kernels, and as data they cannot become compile-time constants. Triton specializes an
integer argument equal to 1 (``rank == 1`` compiled another variant; inside a tuple argument
``do_not_specialize`` does not reach it), so as an argument every rank would need its own
variant; as a word of the handle, every rank runs the same binary, and a new timeout takes
effect without a recompilation or a new CUDA graph. Reading them costs one scalar load each
per program, from a line every program of the launch shares.

This module does not import triton.
"""

from __future__ import annotations

from typing import Sequence

import torch

from .errors import ERR_WORDS

RANK, WORLD, TIMEOUT_NS, SELF_BASE, ABORT, NO_ABORT = 0, 1, 2, 3, 4, 5
#: first word of the error record (ERR_WORDS words)
ERR = 8
#: first word of the base table (WORLD words)
BASES = ERR + ERR_WORDS


def make_handle(rank: int, bases: Sequence[int], timeout_ns: int,
                device: torch.device | str = "cpu") -> torch.Tensor:
    """A handle for ``rank`` of ``len(bases)`` ranks, ``bases[r]`` the address of rank ``r``'s
    heap in this process: int64[BASES + world] on ``device``, error record zero."""
    world = len(bases)
    if not 0 <= rank < world:
        raise ValueError(f"make_handle: rank {rank} is not in [0, {world})")
    words = [0] * (BASES + world)
    words[RANK], words[WORLD], words[TIMEOUT_NS] = rank, world, int(timeout_ns)
    words[SELF_BASE] = int(bases[rank])
    words[ABORT] = NO_ABORT
    words[BASES:] = [int(b) for b in bases]
    return torch.tensor(words, dtype=torch.int64, device=device)


def bases_of(handle: torch.Tensor) -> torch.Tensor:
    """The base table of ``handle`` (a view: int64[world])."""
    return handle[BASES:]


def errors_of(handle: torch.Tensor) -> torch.Tensor:
    """The error record of ``handle`` (a view: int64[ERR_WORDS])."""
    return handle[ERR:ERR + ERR_WORDS]


def set_abort_word(handle: torch.Tensor, address: int) -> None:
    """Point ``handle``'s waits at the abort word at ``address`` (an 8-byte-aligned int64 in
    the same address space as the handle: this rank's symmetric memory)."""
    delta = int(address) - handle.data_ptr()
    if delta % 8:
        raise ValueError(f"set_abort_word: {address:#x} is not 8-byte aligned to the handle")
    handle[ABORT] = delta // 8


def set_timeout(handle: torch.Tensor, timeout_ns: int) -> None:
    """Write a new wait bound into ``handle`` (on CUDA: queued on the current stream, so it
    holds for the kernels launched after it)."""
    handle[TIMEOUT_NS] = int(timeout_ns)

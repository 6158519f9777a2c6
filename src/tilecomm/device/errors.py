"""The device error buffer and its translation into :class:`tilecomm.CommTimeout`.

Every bounded wait in :mod:`tilecomm.device.lang` that expires writes one record into a small
int64 tensor (``DeviceHeap.errors``, local to the rank, never read by peers). The first wait to
give up in a launch claims the record with a compare-and-swap on ``CODE``; every failed wait
bumps ``COUNT``. After the launch the host calls :func:`check` (or ``DeviceHeap.check``), which
raises :class:`DeviceTimeout` and clears the buffer for the next launch.

Layout (int64 words)::

    CODE      0 = no error, WAIT_TIMEOUT, BARRIER_TIMEOUT, ABORTED (a wait cut short by
              ``comm.abort``: OBSERVED holds the abort word, 1 + the rank that aborted)
    RANK      the rank that waited
    PEER      the rank it waited for (the one expected to signal)
    EPOCH     the value it waited for (slot >= EPOCH)
    SLOT      the slot index in the signal pad it polled
    OBSERVED  the slot's value when it gave up
    SITE      a caller-chosen tag (constexpr ``site=`` of wait_ge) naming the wait in the kernel
    COUNT     how many waits of the launch gave up (later ones return at once, see lang.wait_ge)

This module does not import triton (the host side needs none of it).
"""

from __future__ import annotations

from ..errors import CommAborted, CommTimeout

CODE, RANK, PEER, EPOCH, SLOT, OBSERVED, SITE, COUNT = range(8)
ERR_WORDS = 8

OK = 0
WAIT_TIMEOUT = 1      #: wait_ge expired
BARRIER_TIMEOUT = 2   #: a wait inside barrier() expired
ABORTED = 3           #: a wait (wait_ge or barrier) ended because the communicator was aborted

_NAMES = {WAIT_TIMEOUT: "wait", BARRIER_TIMEOUT: "barrier"}


class DeviceTimeout(CommTimeout):
    """A device-side wait gave up: ``rank`` waited for ``peer`` to raise signal slot ``slot``
    to ``epoch`` (it saw ``observed``). ``kernel`` names the launch (also ``collective``),
    ``site`` the wait inside it, ``count`` how many waits of the launch gave up."""

    def __init__(self, message: str, *, kernel: str, code: int, rank: int, peer: int,
                 epoch: int, slot: int, observed: int, site: int, count: int):
        super().__init__(message, collective=kernel, missing=(peer,))
        self.kernel, self.code, self.rank, self.peer = kernel, code, rank, peer
        self.epoch, self.slot, self.observed, self.site, self.count = (epoch, slot, observed,
                                                                       site, count)


class DeviceAborted(CommAborted):
    """A device wait ended early because the communicator was aborted by rank ``by``
    (``comm.abort``): ``rank`` was waiting for ``peer`` at ``epoch`` in ``kernel``."""

    def __init__(self, message: str, *, kernel: str, rank: int, peer: int, epoch: int,
                 by: int):
        super().__init__(message, by=by, reason="the communicator was aborted")
        self.kernel, self.rank, self.peer, self.epoch = kernel, rank, peer, epoch


def decode(words, kernel: str,
           timeout: float | None = None) -> DeviceTimeout | DeviceAborted | None:
    """The error described by the ``ERR_WORDS`` integers ``words``, or None if there is none."""
    w = [int(x) for x in words]
    if len(w) < ERR_WORDS:
        raise ValueError(f"error buffer has {len(w)} words, expected {ERR_WORDS}")
    code = w[CODE]
    if code == OK:
        return None
    if code == ABORTED:
        by = w[OBSERVED] - 1
        return DeviceAborted(f"{kernel}: rank {w[RANK]}'s device wait for rank {w[PEER]} "
                             f"(epoch {w[EPOCH]}) ended early: the communicator was aborted "
                             f"by rank {by}; {w[COUNT]} wait(s) of this launch gave up",
                             kernel=kernel, rank=w[RANK], peer=w[PEER], epoch=w[EPOCH], by=by)
    what = _NAMES.get(code, f"error code {code}")
    after = f" after {timeout:.3g} s" if timeout is not None else ""
    site = f" (site {w[SITE]})" if w[SITE] else ""
    msg = (f"{kernel}: rank {w[RANK]} timed out{after} in a device {what}{site} waiting for "
           f"rank {w[PEER]} to raise signal slot {w[SLOT]} to epoch {w[EPOCH]} (it holds "
           f"{w[OBSERVED]}); {w[COUNT]} wait(s) of this launch gave up. Rank {w[PEER]} did not "
           f"run the matching kernel, died, or counts epochs differently; if it is only slow, "
           f"raise TILECOMM_DEVICE_TIMEOUT.")
    return DeviceTimeout(msg, kernel=kernel, code=code, rank=w[RANK], peer=w[PEER],
                         epoch=w[EPOCH], slot=w[SLOT], observed=w[OBSERVED], site=w[SITE],
                         count=w[COUNT])


def check(errors, kernel: str, timeout: float | None = None, reset: bool = True) -> None:
    """Raise :class:`DeviceTimeout` if the error buffer ``errors`` (a torch tensor on any
    device, e.g. ``DeviceHeap.errors``) holds a record; clear it first when ``reset``.

    Reading a CUDA buffer synchronizes with the kernels that wrote it (``.cpu()``)."""
    words = errors.detach().cpu().tolist()
    err = decode(words, kernel, timeout)
    if err is not None:
        if reset:
            errors.zero_()
        raise err

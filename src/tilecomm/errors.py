"""Exceptions raised by tilecomm. Every collective failure is a :class:`CommError`."""

from __future__ import annotations


class CommError(RuntimeError):
    """A communication operation failed (on this rank or because of a peer)."""


class CommMismatch(CommError):
    """Ranks disagree on a call: collective, size, dtype, op, root or algorithm.

    Raised on every rank of the call, with a message naming the field and each rank's value.
    """


class CommAborted(CommError):
    """The communicator was aborted (``comm.abort()``) by ``by`` (a rank of it) because of
    ``reason``: the call that raised this was cut short, or came after the abort. The
    communicator takes no more calls; make a new one (``comm.shrink``) or close it."""

    def __init__(self, message: str, *, by: int = -1, reason: str = ""):
        super().__init__(message)
        self.by = by
        self.reason = reason


class CommRevoked(CommAborted):
    """The communicator was revoked (``comm.revoke()``) by ``by``: in-flight calls end with
    this, and it then takes only ``shrink`` and ``close``."""


def stopped_error(revoked: bool, by: int, reason: str, where: str = "",
                  detail: str = "") -> CommAborted:
    """The CommRevoked (``revoked``) or CommAborted of a communicator that rank ``by`` stopped
    because of ``reason``; ``where`` begins the message (the call it cut short), ``detail``
    follows the rank ("(its last call was #7)"). One wording wherever a stop is seen: the
    channel's stop word, the store across hosts."""
    then = ("it takes only shrink() and close() now" if revoked else
            "it takes no more calls: make a new one with shrink(), or close it")
    text = (f"{where}the communicator was {'revoked' if revoked else 'aborted'} by rank {by}"
            f"{detail}: {reason}; {then}")
    return (CommRevoked if revoked else CommAborted)(text, by=by, reason=reason)


class NoDeviceError(CommError):
    """A call needs a CUDA GPU and this machine has none usable (a CPU-only torch build, or
    no driver or visible GPU). Raised before any communication, with the call's name and the
    reason; a :class:`CommError` so that code catching those still catches it."""


class CommTimeout(CommError):
    """A rank waited longer than the timeout for peers that did not arrive.

    ``collective``, ``seq`` and ``missing`` (the ranks that did not arrive) are attributes.
    Sequence numbers count the communicator's collective calls; ``#0`` is the handshake made
    when it was created, so the first call of the program is ``#1``.
    """

    def __init__(self, message: str, *, collective: str = "", seq: int = -1,
                 missing: tuple[int, ...] = ()):
        super().__init__(message)
        self.collective = collective
        self.seq = seq
        self.missing = missing


class RankError(CommError):
    """Raised by :func:`tilecomm.launch` when a rank raised or died.

    ``rank`` is the rank whose failure is reported (the reporter), ``exc_type`` the name of its
    exception (or ``"exit"``), and ``remote_traceback`` the traceback text from that rank.
    ``culprits`` are the ranks at fault when they are not the reporter: the ranks a timeout
    waited for in vain (``CommTimeout.missing``, e.g. a stopped or dead rank), or a rank whose
    process died; empty when the reporter's own exception is the cause.
    """

    def __init__(self, rank: int, exc_type: str, message: str, remote_traceback: str = "",
                 culprits: tuple[int, ...] = ()):
        culprits = tuple(sorted(set(culprits)))
        if culprits and culprits != (rank,):
            who = ", ".join(map(str, culprits))
            text = (f"rank{'s' if len(culprits) > 1 else ''} {who} at fault, reported by rank "
                    f"{rank}: {exc_type}: {message}")
        else:
            text = f"rank {rank} failed: {exc_type}: {message}"
        if remote_traceback:
            text += f"\n\n--- traceback from rank {rank} ---\n{remote_traceback}"
        super().__init__(text)
        self.rank = rank
        self.exc_type = exc_type
        self.remote_message = message
        self.remote_traceback = remote_traceback
        self.culprits = culprits
        #: other ranks that failed too: rank -> (exception type, message, traceback)
        self.others: dict[int, tuple[str, str, str]] = {}

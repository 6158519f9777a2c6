"""The interface a backend implements. The Communicator validates calls and picks algorithms;
a backend only moves bytes. Backends register per device type and are looked up by the tensor's
device, so ops never branch on a backend's name.

:data:`DEVICE_BACKENDS` maps a tensor's device type to a factory ``(communicator) -> Backend``;
the Communicator creates each backend on the first call with such a tensor (collectively: every
rank makes the same calls in the same order)."""

from __future__ import annotations

import abc
from dataclasses import dataclass, field
from typing import Callable, Sequence

import numpy as np

from ..types import DType, ReduceOp


@dataclass
class CollectiveCall:
    """One collective as the backend sees it.

    ``buffers`` maps the schedule's user buffer names (``buf``, ``in``, ``out``) to flat,
    contiguous ``uint8`` numpy arrays over the caller's tensors. ``count`` is the element count
    of the caller's input (see ``algorithms.collectives.buffer_totals``); for all_to_all_v it is
    the number of elements per row, and ``send_rows``/``recv_rows`` carry the row counts.
    """

    collective: str
    algo: str
    dtype: DType
    count: int
    buffers: dict[str, np.ndarray]
    op: ReduceOp | None = None
    root: int = 0
    send_rows: Sequence[int] | None = None
    recv_rows: Sequence[int] | None = None
    #: all_to_all_v: called with the number of rows this rank receives, returns the out buffer.
    make_out: Callable[[int], np.ndarray] | None = None
    #: identifies a repeated call (same buffers, same arguments) so its plan can be reused;
    #: must contain the buffers' data pointers. None: derived from the buffers.
    cache_key: tuple | None = None
    #: what a backend notes about this call while it runs (hier: rows learned from peers)
    info: dict = field(default_factory=dict)
    #: all_gather: the dims of the input after dim 0; ranks must agree on them (the output's
    #: shape depends on them), not only on ``count``
    row_shape: tuple = ()


def check_split_sizes(send: Sequence[Sequence[int]], expect: Sequence[Sequence[int]],
                      label: str) -> None:
    """all_to_all_v: raise CommMismatch unless every rank's expected rows match what the
    sender sends. ``send[r][j]``: rows rank r sends to rank j; ``expect[r][j]``: rows rank r
    expects from rank j (-1: not given). Every rank that holds the same matrices raises the
    same message. ``label``: the call, e.g. "all_to_all_v #3"."""
    from ..errors import CommMismatch

    for r, row in enumerate(expect):
        for j, want in enumerate(row):
            if want >= 0 and want != send[j][r]:
                raise CommMismatch(f"{label}: ranks disagree on split sizes: rank {r} expects "
                                   f"{want} rows from rank {j}, which sends it {send[j][r]}")


def _cpu_backend(comm) -> "Backend":
    from ..settings import settings

    if settings().cpu_kernels == "triton":   # the GPU kernels in the Triton interpreter
        return triton_backend(comm, "cpu")
    return comm.host.backend


def _cuda_backend(comm) -> "Backend":
    return triton_backend(comm, "cuda")


def triton_backend(comm, device: str) -> "Backend":
    if device == "cpu":
        from ..device.heap import require_interpreter
        require_interpreter("TILECOMM_CPU_KERNELS=triton (the collectives' kernels)")
    from .triton import TritonBackend

    return TritonBackend(comm, device)


#: device type -> factory of the backend for collectives on tensors of that device
DEVICE_BACKENDS: dict[str, Callable] = {"cpu": _cpu_backend, "cuda": _cuda_backend}


class PreparedCall:
    """A validated call as its backend runs it, again and again.

    NOTE [prepared calls]: the Communicator keeps a repeated call (NOTE [call memo], NOTE
    [pair memo] in ``tilecomm.calls``) as the PreparedCall ``backend.prepare(call)`` returned,
    and runs it with :meth:`run`. What the backend builds for the call lives here and nowhere
    else (the CPU executor's native programs and ready-made steps per scratch parity, in
    ``native`` and ``ready``), so forgetting the memo forgets it too
    (``Communicator.forget_calls``)."""

    __slots__ = ("backend", "call", "native", "ready", "runner")

    def __init__(self, backend: "Backend", call: CollectiveCall, runner=None):
        self.backend, self.call = backend, call
        #: what the backend built for this call, by scratch parity (the CPU executor: its
        #: native programs with their base addresses, and its ready-made steps)
        self.native = None
        self.ready = None
        #: ``runner(call, prepared)`` runs it: the backend's entry point itself where it has
        #: one (the executor's ``run``: no frame between the Communicator and it)
        self.runner = runner or backend.run_prepared

    def run(self) -> None:
        self.runner(self.call, self)


class Backend(abc.ABC):
    """Moves data between the ranks of one communicator."""

    rank: int
    world_size: int
    #: False: ``CollectiveCall.buffers`` are flat uint8 numpy arrays (host executors); True:
    #: flat torch tensors of the call's dtype on the backend's device (kernel backends)
    tensor_buffers: bool = False
    #: which rule set of ``tuner.choose`` resolves ``algo="auto"`` ("cpu", "gpu")
    kind: str = "cpu"

    def algorithms(self, collective: str) -> list[str] | None:
        """Algorithms this backend runs for ``collective``; None: every registered schedule."""
        return None

    def check(self, collective: str, algo: str, dtype, op) -> None:
        """Raise ``ValueError``/``TypeError`` naming what is supported if this backend cannot
        run the call (before any rank starts it)."""

    def host_communicator(self):
        """The Communicator over this rank's host when the backend spans hosts (None: the
        communicator is the host's own)."""
        return None

    def process_group(self, name: str, timeout: float | None = None, device: str = "cpu"):
        """A torch.distributed group over all ranks for a layer that sends its own messages
        between hosts (collective; ``timeout``: its own, default the communicator's;
        ``device``: the kind of tensors it carries); None when the ranks share one host."""
        return None

    def attach_debug(self, flight, tracer) -> None:
        """Receive the communicator's flight recorder and the process's tracer (or None), for
        a host backend's waits and phases (``tilecomm.debug``); default: nothing to report."""

    @abc.abstractmethod
    def run(self, call: CollectiveCall) -> None:
        """Execute ``call`` (all ranks call with matching arguments)."""

    def prepare(self, call: CollectiveCall) -> PreparedCall:
        """``call`` as the Communicator keeps it to run again (NOTE [prepared calls])."""
        return PreparedCall(self, call)

    def run_prepared(self, call: CollectiveCall, p: PreparedCall) -> None:
        """Execute the prepared call ``p`` (of ``call``); default: as any call."""
        self.run(call)

    def forget_calls(self) -> None:
        """Drop what this backend keeps for calls it ran (``Communicator.forget_calls``);
        default: nothing kept."""

    @abc.abstractmethod
    def reject(self, collective: str, message: str) -> None:
        """Tell the peers that this rank refused its part of the next collective."""

    @abc.abstractmethod
    def rendezvous(self, name: str, count: int, extra: int) -> list[int]:
        """Handshake without data: checks ``count`` agrees, returns every rank's ``extra``."""

    @abc.abstractmethod
    def send(self, data: np.ndarray, dtype: DType, numel: int, peer: int) -> None: ...

    @abc.abstractmethod
    def recv(self, out: np.ndarray, dtype: DType, numel: int, peer: int) -> None: ...

    @abc.abstractmethod
    def probe(self, peer: int) -> bool:
        """True when a message from ``peer`` is waiting to be received (never blocks)."""

    @abc.abstractmethod
    def close(self) -> None: ...

"""The host port of a communicator (``comm.host``): the control path the layers built on a
communicator use, instead of reaching into its private state.

A collective goes ``Communicator`` (validation, dispatch, the flight record) -> a backend. The
layers beside and above it (the Triton backend, the device heaps, ``hier/``, ``torch/``,
``ops/``, ``moe/``, ``kv/``, the launcher, the bench and the CLI) also need the host side of
the communicator directly, and only these things:

* **agreement on small host values**, always on the host executor whatever device the
  caller's tensors are on: :meth:`HostPort.exchange` (every rank's ints), :meth:`all_gather`
  (a small CPU tensor), :meth:`barrier`, :meth:`rendezvous` (a call descriptor every rank
  compares: ``CommMismatch`` where they differ);
* **refusing a call** so that the peers raise instead of waiting: :meth:`refusing` (a context
  in which an exception is announced to the peers before it is raised), :meth:`reject`;
* **the memory**: the shared-memory heap (:attr:`heap`, this rank's index in it
  :attr:`heap_rank`, the address range of its symmetric part :attr:`heap_range`);
* **the host backend** (:attr:`backend`: the shared-memory executor, or across hosts the
  hierarchical backend) for layers that run their own steps on it (``hier/``, the kernel
  backends' host handshakes), its wait :attr:`channel`, and :meth:`cancel_waits`;
* across hosts, the communicator of this rank's host (:attr:`host_comm`) and the rails.

None of these record a flight record of their own or take part in the call memos: they are
the plumbing of calls that do.
"""

from __future__ import annotations

import torch

from .backends.base import Backend, CollectiveCall
from .types import lookup_dtype


class HostPort:
    """``comm.host`` (see the module docstring). Made by the Communicator."""

    def __init__(self, comm, backend: Backend, heap, heap_rank: int, heap_range, refusing):
        """``refusing``: the communicator's context for argument checks (NOTE on
        :meth:`refusing`)."""
        self._comm = comm
        self._refusing = refusing
        self.backend = backend
        self.heap = heap
        self.heap_rank = heap_rank
        #: ``(lo, hi)``: addresses of this rank's symmetric heap in this process
        self.heap_range = heap_range
        self.rank, self.world_size = comm.rank, comm.world_size
        self.timeout = comm.timeout
        self._on_stop: list = []

    # ---- agreement ---------------------------------------------------------------------------
    def exchange(self, values) -> list[list[int]]:
        """Every rank's ``values`` (ints, the same count everywhere), in rank order
        (``comm.exchange``)."""
        return self._comm.exchange(values)

    def all_gather(self, t: torch.Tensor) -> torch.Tensor:
        """Every rank's small CPU tensor ``t``, concatenated along dim 0 in rank order, on the
        host executor (never a kernel backend; no flight record)."""
        t = t.detach().contiguous().cpu()
        d = lookup_dtype(t.dtype, what="all_gather")
        out = torch.empty((self.world_size * t.numel(),), dtype=t.dtype)
        be = self.backend
        avail = be.algorithms("all_gather")
        algo = "direct" if avail is None or "direct" in avail else avail[0]
        flat = (lambda x: x.reshape(-1)) if be.tensor_buffers else _np
        be.run(CollectiveCall("all_gather", algo, d, t.numel(),
                              {"in": flat(t), "out": flat(out)}))
        return out.reshape((self.world_size * t.shape[0], *t.shape[1:])) if t.dim() else out

    def barrier(self) -> None:
        """Every rank meets (no flight record: the plumbing of a recorded call)."""
        self.backend.rendezvous("barrier", 0, 0)

    def rendezvous(self, name: str, count: int, extra: int) -> list[int]:
        """Every rank meets at a call named ``name`` and compares ``count`` (``CommMismatch``
        where they differ); returns every rank's ``extra``."""
        return self.backend.rendezvous(name, count, extra)

    def probe(self, peer: int) -> bool:
        return self.backend.probe(peer)

    # ---- refusing a call ---------------------------------------------------------------------
    def refusing(self, name: str, tensor=None):
        """A context for checking a call's arguments: an exception raised inside is announced
        to the peers (they raise too, naming this rank's error) and then raised here.
        ``tensor``: the call's tensor, whose device's backend announces it."""
        return self._refusing(name, tensor)

    def reject(self, name: str, message: str) -> None:
        """Tell the peers this rank refuses its next call ``name`` (they raise ``message``)."""
        self.backend.reject(name, message)

    # ---- waits -------------------------------------------------------------------------------
    @property
    def channel(self):
        """The host backend's wait channel (None where it has none)."""
        return getattr(self.backend, "channel", None)

    def cancel_waits(self, reason: str) -> None:
        """End every wait in progress on the host (in any thread) with a ``CommError`` saying
        ``reason`` (the torch backend's send/recv threads must not outlive a destroyed group)."""
        ch = self.channel
        if ch is not None:
            ch.cancelled = reason

    def stop(self, revoke: bool, reason: str, by: int | None = None) -> None:
        """Post this rank's stop word (``comm.abort`` / ``comm.revoke``; NOTE [stop word] in
        backends/cpu/channel.py): every rank's calls end with CommAborted / CommRevoked.
        ``by``: the rank that stopped the communicator (default this one; another when this
        rank relays a stop it heard of from another host). Across hosts the backend also
        tells the other hosts (``abort_links``: NOTE [stop across hosts] in hier/rails.py)."""
        from .backends.cpu.channel import STOP_ABORTED, STOP_REVOKED

        by = self.rank if by is None else by
        ch = self.channel
        if ch is not None:
            ch.post_stop(STOP_REVOKED if revoke else STOP_ABORTED, reason, by)
        links = getattr(self.backend, "abort_links", None)
        if links is not None:
            links(by, reason, revoke)
        for ref in list(self._on_stop):
            fn = ref()
            if fn is not None:
                fn(by)

    def on_stop(self, fn) -> None:
        """Call ``fn(rank)`` when this rank stops the communicator (a bound method, held
        weakly): the device heaps cut their kernels' waits short (NOTE [device abort])."""
        import weakref

        self._on_stop.append(weakref.WeakMethod(fn))

    def attach_debug(self, flight, tracer) -> None:
        """Record the host backend's waits on ``flight`` (an enclosing communicator's calls)."""
        self.backend.attach_debug(flight, tracer)

    # ---- across hosts ------------------------------------------------------------------------
    @property
    def host_comm(self):
        """The communicator of this rank's host (the communicator itself on one host)."""
        return self._comm.host_comm

    def rails(self, device: str = "cpu"):
        """The torch.distributed groups joining the hosts for ``device`` tensors (ranks that
        span hosts only)."""
        rails_for = getattr(self.backend, "rails_for", None)
        if rails_for is None:
            raise ValueError("rails: this communicator's ranks share one host")
        return rails_for(device)


def _np(t: torch.Tensor):
    """Flat uint8 numpy view of a CPU tensor (what the host executor's buffers are)."""
    return t.detach().reshape(-1).view(torch.uint8).numpy()


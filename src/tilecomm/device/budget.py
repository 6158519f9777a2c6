"""How many CTAs one kernel launch of a rank may use, so that every rank's grid is resident.

NOTE [CTA budget]: a communicating kernel waits for its peers' kernels (program ``i`` of a
launch waits for program ``i`` of its peers, a GEMM tile for a peer's chunk), so it progresses
only while those are resident too. A launch larger than what fits relied on CUDA dispatching
CTAs in order (done in practice, never promised), and ranks that share a GPU compete for its
SMs: two ranks launching one CTA per SM each fill the GPU twice over, and a rank spinning on
every SM can keep its peer's kernel off the GPU until the wait gives up. So every launch of a
communicating kernel has at most the rank's *budget* of CTAs (one CTA per SM it may use):

* each rank reports ``[sm_count, device key, MPS share]``: the SM count the driver reports to
  it (under MPS with ``CUDA_MPS_ACTIVE_THREAD_PERCENTAGE`` the driver already reports the
  share: 13 of 132 SMs at 10%), the physical GPU, and that percentage (100 without one);
* on each GPU the shares of the ranks on it sum to ``S`` percent; a rank may use
  ``sm_count * min(1, 100 / S)`` SMs: its own share when the shares fit (MPS, shares summing to
  at most 100), else an equal cut (no MPS: ``sms // ranks``; shares summing to more than 100:
  scaled down until they fit);
* the budget is the smallest of those over all ranks (every rank launches the same grid);
* ``TILECOMM_GPU_CTAS`` (the smallest value any rank sets, 0 = none) overrides it.

Kernels with a 2-D grid ``(P, W)`` keep ``P * W`` within the budget. On CUDA the collective
kernels are also launched cooperatively, so a grid that still cannot be co-resident (another
process's kernels holding SMs) fails at launch instead of hanging. In the Triton interpreter
programs run one by one and the budget is a small constant (each program costs a signal
exchange there), unless ``TILECOMM_GPU_CTAS`` sets one.

This module does not import triton.
"""

from __future__ import annotations

import os
import zlib
from dataclasses import dataclass

import torch

#: CTAs per launch in the Triton interpreter (programs run one after another on the CPU)
INTERPRETER_CTAS = 4


@dataclass(frozen=True)
class CtaBudget:
    """The grid limit every rank of a communicator applies on one device type."""

    #: the most CTAs one launch may have (the same on every rank)
    ctas: int
    #: the most ranks on one physical device
    sharing: int
    #: where the number comes from: "setting", "mps share", "sms / ranks", "interpreter"
    source: str

    def programs(self, n: int, width: int = 1) -> int:
        """Programs for ``n`` units of work when each program is ``width`` CTAs (a ``(P,
        width)`` grid): at least 1, at most ``ctas // width``."""
        limit = max(1, self.ctas // max(1, int(width)))
        return max(1, min(limit, int(n)))


def budget_from_rows(rows, setting: list[int] | None = None) -> CtaBudget:
    """The budget from every rank's ``[sm_count, device_key, mps_percentage]`` (percentage
    100 when none is set) and every rank's ``TILECOMM_GPU_CTAS`` (0: none). Pure; the same
    on every rank for the same rows (NOTE [CTA budget])."""
    rows = [[int(v) for v in r] for r in rows]
    per_device: dict[int, list[list[int]]] = {}
    for r in rows:
        per_device.setdefault(r[1], []).append(r)
    sharing = max(len(v) for v in per_device.values())
    cap, source = None, "sms / ranks"
    for r in rows:
        shares = sum(max(1, min(100, q[2])) for q in per_device[r[1]])
        pct = max(1, min(100, r[2]))
        usable = r[0] * 100 // shares if shares > 100 else r[0]
        if pct < 100 and shares <= 100:
            source = "mps share"
        cap = usable if cap is None else min(cap, usable)
    given = [s for s in (setting or []) if s > 0]
    if given:
        return CtaBudget(min(given), sharing, "setting")
    return CtaBudget(max(1, cap), sharing, source)


def mps_percentage() -> int:
    """This process's ``CUDA_MPS_ACTIVE_THREAD_PERCENTAGE`` (100 when unset or unreadable)."""
    try:
        v = float(os.environ.get("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE", "100"))
    except ValueError:
        return 100
    return int(max(1, min(100, v)))


def device_key(device: torch.device) -> int:
    """An integer naming the physical GPU (its UUID; the PCI bus otherwise), the same in every
    process whatever CUDA_VISIBLE_DEVICES renumbers."""
    try:
        p = torch.cuda.get_device_properties(device)
        key = str(getattr(p, "uuid", "") or getattr(p, "pci_bus_id", "") or
                  f"{p.pci_domain_id}:{p.pci_bus_id}:{p.pci_device_id}")
    except Exception:  # noqa: BLE001 - a CPU device heap
        key = str(device)
    return zlib.crc32(key.encode()) & 0x7FFFFFFF


def sm_count(device: torch.device) -> int:
    """The SM count the driver reports to this process for ``device`` (its MPS share under
    MPS with an active thread percentage); 8 for a CPU device."""
    try:
        return int(torch.cuda.get_device_properties(device).multi_processor_count)
    except Exception:  # noqa: BLE001 - a CPU device heap
        return 8


def cta_budget(exchange, device: torch.device, *, interpret: bool) -> CtaBudget:
    """This communicator's budget on ``device``. Collective on a GPU (``exchange(values) ->
    every rank's values``, e.g. ``comm.exchange``); local in the interpreter."""
    from ..settings import settings

    given = int(settings().gpu_ctas)
    if interpret:
        if given:
            return CtaBudget(given, 1, "setting")
        return CtaBudget(INTERPRETER_CTAS, 1, "interpreter")
    rows = exchange([sm_count(device), device_key(device), mps_percentage(), given])
    return budget_from_rows([r[:3] for r in rows], [r[3] for r in rows])

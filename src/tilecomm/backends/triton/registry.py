"""The GPU kernel table: ``(collective, algo) -> launcher``, and the launcher contract.

Kernel families live in ``kernels/<family>.py`` and register their launchers with
:func:`kernel`; :func:`load` imports the families (which imports triton: call it only where
kernels run, after ``TRITON_INTERPRET`` is decided). A family file that does not exist yet is
skipped, so families can be added independently; one that exists but fails to import raises.

The ``plan`` family (``kernels/plan.py``) registers one generic launcher with
:func:`register_plan`: it executes any lowered schedule, so :func:`lookup` falls back to it for
every registered algorithm that has no fused kernel (or whose fused kernel lacks the dtype or
op), and for every algorithm when fused kernels are off (``TILECOMM_GPU_FUSED=0``, or
:data:`FUSED` ``= False`` in a process). :func:`supported` then lists every registered
algorithm.

Names are the algorithm registry's (``tilecomm.algorithms``): a kernel implements the data
movement of the schedule of the same name (which peer's chunk is read, reduced or written in
which step), in pull or push form over symmetric memory.

Launcher contract
=================

``launcher(ctx: KernelContext, call: CollectiveCall) -> None``

``call`` (``tilecomm.backends.base.CollectiveCall``), as the Communicator built it:

* ``collective, algo``: the table key. ``dtype``: ``tilecomm.types.DType`` (``dtype.torch``).
  ``op``: ``ReduceOp`` (reducing collectives) or None. ``root``: broadcast/reduce root.
* ``buffers``: **flat, contiguous 1-D torch tensors of ``dtype.torch`` on ``ctx.device``**
  (the caller's tensors, or contiguous temporaries the Communicator copies back afterwards):

  ==============  ===========================================================================
  all_reduce      ``buf``: ``count`` elements, in and out (in place)
  broadcast       ``buf``: ``count`` elements; root's is the input, every rank's the output
  reduce          ``buf``: ``count`` elements; reduced into the root's
  all_gather      ``in``: ``count``; ``out``: ``world * count`` (rank j's input at ``j*count``)
  reduce_scatter  ``in``: ``count`` (= ``world * m``); ``out``: ``m`` (this rank's chunk)
  all_to_all      ``in``, ``out``: ``count`` (= ``world * m``); block j of in goes to rank j,
                  ``out``'s block j comes from rank j
  all_to_all_v    ``count`` = elements per row; ``in``: ``sum(send_rows) * count``;
                  ``send_rows[j]`` rows go to rank j; ``recv_rows`` may be None (learn the
                  counts with ``ctx.host_all_gather``); ``out`` is absent when ``recv_rows``
                  was not given: create it with ``call.make_out(total_rows)`` (returns a flat
                  tensor of ``total_rows * count`` elements on ``ctx.device``)
  ==============  ===========================================================================

* Outputs must be fully written by the work the launcher queues on the current stream (the
  call path is asynchronous: the backend reads the device error record only at check points,
  ``comm.synchronize()`` and close, or after every call with TILECOMM_DEVICE_DEBUG=1).

``ctx`` (:class:`tilecomm.backends.triton.context.KernelContext`) gives:

* ``heap`` (``tilecomm.device.DeviceHeap``), ``rank``, ``world_size``, ``device``,
  ``interpret`` (kernels run in the Triton interpreter).
* ``epoch_dev``: int64[1] on the device holding the epoch of the call; kernels take it as
  ``epoch_ptr`` and load it (NOTE [device epochs] in ``context.py``: ``ctx.begin`` queues
  ``epoch_dev += 1`` before the launcher, so a CUDA graph replay gets a new epoch too). A
  launcher that launches more kernels calls ``ctx.next_epoch()`` before each further one.
  ``ctx.epoch`` is the host count (equal in eager mode), used to name calls in errors.
* ``handle``: the device handle (``DeviceHeap.handle``), the one argument the device-API
  functions take for peers, waits and errors.
* ``signals(groups)``: the int64 symmetric signal pad with at least ``groups * world`` slots.
  **Slot rule**: slot ``g * world + p`` of any rank's pad is written by rank ``p`` only (as
  ``lang.barrier(pad, g * world, ...)`` does), whatever the kernel. Values are epochs.
* ``scratch(name, numel, dtype)``: a persistent symmetric tensor (at least ``numel``
  elements, contents undefined) per name; growing it is collective and every rank asks for
  the same sizes because the calls match.
* ``halves(name, numel, dtype)``: ``(base, half)``, both parity halves of scratch ``name``;
  the kernel uses ``base + (epoch % 2) * half`` with the epoch it loads (rule 3), staging
  local inputs there itself. ``ctx.zero_copy`` is True when the input is a heap tensor
  (every rank must then pass one at the same offset; checked at check points and in debug
  mode), and kernels read it in place. (``staged``/``half`` choose on the host: eager only.)
* ``programs(n)``, ``block``: grid size for ``n`` elements per chunk and the block size.
* ``host_all_gather(ints)``: list of every rank's list of ints (host communicator; for
  counts).

Rules every kernel follows (they make consecutive calls of *different* kernels on the same
pad and scratch safe, see docs/device-api.md "Collective kernels"):

1. Slot rule above; a wait is ``>= epoch`` on a slot written by the rank it names.
2. A call completes on a rank only after every rank has *started* it (every rank's data, or
   a barrier, reaches every rank). Hence when a rank starts call k+1 every rank has finished
   call k-1.
3. Data peers read or write lives in a parity half (``epoch % 2`` of the loaded epoch) of a
   scratch buffer, or in
   the caller's heap tensor (``ctx.zero_copy``) -- then the kernel syncs once more before it
   returns or before it overwrites that tensor (the caller may modify it right after).
4. In the interpreter a grid's programs run one after another: program ``i`` may wait only on
   peers' programs (use per-program slot groups), never on a later program of its own launch.
5. Signals are int64 atomics (integer atomics are atomic across processes in the
   interpreter; its fp16/bf16 atomics are not). Reductions accumulate in fp32 for fp16/bf16.

A launcher is registered with the dtypes and ops it supports; the backend rejects other calls
before launching, with a message that names what is supported.
"""

from __future__ import annotations

import importlib
import importlib.util
from dataclasses import dataclass
from typing import Callable

import torch

#: kernel families, imported by :func:`load` if their module exists
FAMILIES = ("all_reduce", "gather_scatter", "all_to_all", "broadcast", "plan")

FLOATS = (torch.float32, torch.float16, torch.bfloat16)
ALL_DTYPES = FLOATS + (torch.float64, torch.int32, torch.int64)
REDUCE_OPS = ("sum", "avg", "min", "max", "prod")

Launcher = Callable[["object", "object"], None]  # (KernelContext, CollectiveCall) -> None


@dataclass(frozen=True)
class KernelSpec:
    collective: str
    algo: str
    launch: Launcher
    dtypes: tuple
    ops: tuple
    #: COMPILE entries ``(jit_fn, signature, constexprs)`` for the sm_90 compile check
    compile: tuple = ()


#: ``(collective, algo) -> KernelSpec``; filled by the family modules on :func:`load`
KERNELS: dict[tuple[str, str], KernelSpec] = {}


def kernel(collective: str, algo: str, *, dtypes=ALL_DTYPES, ops=REDUCE_OPS) -> Callable:
    """Decorator registering ``launcher(ctx, call)`` as the GPU kernel of ``collective/algo``.

    ``algo`` must be a registered schedule of ``collective`` (same data movement). ``dtypes``:
    torch dtypes it handles; ``ops``: ReduceOp values (ignored for non-reducing collectives).
    """
    from ...algorithms.registry import algorithms

    if algo not in algorithms(collective):
        raise ValueError(f"GPU kernel {collective}/{algo}: no schedule of that name; the "
                         f"kernels implement registered algorithms ({algorithms(collective)})")

    def deco(fn: Launcher) -> Launcher:
        key = (collective, algo)
        if key in KERNELS and KERNELS[key].launch is not fn:
            raise ValueError(f"GPU kernel {collective}/{algo} registered twice")
        KERNELS[key] = KernelSpec(collective, algo, fn, tuple(dtypes), tuple(ops))
        return fn

    return deco


_loaded = False


def load() -> dict[tuple[str, str], KernelSpec]:
    """Import every kernel family that exists (imports triton) and return :data:`KERNELS`."""
    global _loaded
    if not _loaded:
        for fam in FAMILIES:
            name = f"{__package__}.kernels.{fam}"
            if importlib.util.find_spec(name) is not None:
                importlib.import_module(name)
        _loaded = True
    return KERNELS


#: the generic plan kernel (``kernels/plan.py``), filled by :func:`register_plan` on
#: :func:`load`: ``launch``, ``dtypes`` (reducing collectives), ``move_dtypes`` (the others),
#: ``ops``
PLAN: dict = {}

#: process-wide override of ``TILECOMM_GPU_FUSED`` (None: the setting). False runs every call
#: through the plan kernel, True prefers the fused kernels (tests switch it per rank process)
FUSED: bool | None = None

_PLAN_SPECS: dict[tuple[str, str], KernelSpec] = {}


def register_plan(launch: Launcher, *, dtypes, move_dtypes, ops) -> None:
    """Register the generic plan kernel's launcher, which runs every registered schedule."""
    PLAN.update(launch=launch, dtypes=tuple(dtypes), move_dtypes=tuple(move_dtypes),
                ops=tuple(ops))
    _PLAN_SPECS.clear()


def plan_spec(collective: str, algo: str) -> KernelSpec | None:
    """The plan kernel as the kernel of ``collective/algo`` (None: no such schedule, or the
    plan family is not loaded)."""
    from ...algorithms.collectives import COLLECTIVES
    from ...algorithms.registry import algorithms

    load()
    if not PLAN or algo not in algorithms(collective):
        return None
    key = (collective, algo)
    spec = _PLAN_SPECS.get(key)
    if spec is None:
        reduces = COLLECTIVES[collective].reduces
        spec = _PLAN_SPECS[key] = KernelSpec(
            collective, algo, PLAN["launch"],
            PLAN["dtypes"] if reduces else PLAN["move_dtypes"], PLAN["ops"])
    return spec


def fused_enabled() -> bool:
    """Whether the hand-fused kernels are preferred (:data:`FUSED`, else TILECOMM_GPU_FUSED)."""
    if FUSED is not None:
        return bool(FUSED)
    from ...settings import settings

    return bool(settings().gpu_fused)


def supported(collective: str) -> list[str]:
    """Algorithms with a GPU kernel for ``collective`` (loads the families): every registered
    schedule once the plan kernel is loaded (registry order), else the fused kernels'."""
    from ...algorithms.registry import algorithms

    table = load()
    if PLAN:
        return list(algorithms(collective))
    return [a for (c, a) in table if c == collective]


def _accepts(spec: KernelSpec | None, dtype: torch.dtype, op: str | None) -> bool:
    return spec is not None and dtype in spec.dtypes and (op is None or op in spec.ops)


def lookup(collective: str, algo: str, dtype: torch.dtype, op: str | None,
           fused: bool | None = None) -> KernelSpec:
    """The kernel for a call, or ``ValueError``/``TypeError`` naming what is supported.

    The fused kernel of ``collective/algo`` when fused kernels are enabled (``fused``, else
    :func:`fused_enabled`) and it takes ``dtype`` and ``op``; otherwise the plan kernel, which
    runs every registered schedule."""
    table = load()
    fast = table.get((collective, algo))
    if fused is None:
        fused = fused_enabled()
    if fused and _accepts(fast, dtype, op):
        return fast
    plan = plan_spec(collective, algo)
    if _accepts(plan, dtype, op):
        return plan
    spec = plan or fast
    if spec is None:
        have = supported(collective)
        raise ValueError(f"{collective}: no GPU kernel for algorithm {algo!r}; GPU kernels: "
                         f"{', '.join(have) or 'none'} (or algo='auto')")
    dtypes = set(spec.dtypes) | (set(fast.dtypes) if fused and fast is not None else set())
    if dtype not in dtypes:
        names = ", ".join(str(d).removeprefix("torch.") for d in spec.dtypes)
        raise TypeError(f"{collective}/{algo}: GPU kernel does not support "
                        f"{str(dtype).removeprefix('torch.')}; supported: {names}")
    raise ValueError(f"{collective}/{algo}: GPU kernel does not support op {op!r}; "
                     f"supported: {', '.join(spec.ops)}")


#: the all_reduce / all_gather / reduce_scatter kernels index with int32 (``n: i32``, offsets
#: like ``c * n`` and ``start + step`` in int32); this margin covers one grid's step past the end
I32_MARGIN = 1 << 22


def check_int32(collective: str, algo: str, elements: int) -> None:
    """Raise ``ValueError`` if a kernel indexing with int32 would overflow on a call whose
    largest offset is ``elements`` (e.g. ``world * count`` for all_gather): the offsets would
    wrap negative and the kernel would write outside its buffers. Deterministic in the call,
    so every rank raises the same."""
    limit = (1 << 31) - I32_MARGIN
    if int(elements) >= limit:
        raise ValueError(f"{collective}/{algo}: {int(elements)} elements exceed what the GPU "
                         f"kernel indexes with int32 ({limit}); split the call")


def compile_entries() -> list[tuple]:
    """Every registered kernel's COMPILE entries (for tilecomm.device.compile_check)."""
    out = []
    for fam in FAMILIES:
        name = f"{__package__}.kernels.{fam}"
        if importlib.util.find_spec(name) is not None:
            out.extend(getattr(importlib.import_module(name), "COMPILE", []))
    return out

"""Device-side communication primitives: Triton ``@jit`` functions over a symmetric heap.

Import this module only where Triton kernels run; set ``TRITON_INTERPRET=1`` *before* the
first import to run them on the CPU (the shared-memory heap). Every function runs under the
interpreter and compiles for sm_90, with Triton 3.9 (native path) and with Triton 3.6 (the
compatibility path below; its only inline assembly is the global-timer read, which the
interpreter replaces with the CPU clock).

Vocabulary
----------
symmetric pointer
    A pointer into this rank's copy of a symmetric object (``DeviceHeap.alloc``). Every rank
    has the object at the same offset from its heap base, so ``peer_ptr`` finds rank ``p``'s
    copy by rebasing: ``ptr - bases[rank] + bases[peer]``.
``heap``
    The device handle (``DeviceHeap.handle``, a pointer to int64; layout in
    :mod:`tilecomm.device.handle`): this rank's number, every rank's heap base address as
    mapped in *this* process, the error record of bounded waits and the wait bound. Every
    function that touches a peer or waits takes it; :func:`my_rank` and :func:`world_size`
    read the two numbers a kernel usually needs itself.
signal pad / slot
    A symmetric int64 (or int32) tensor (``DeviceHeap.signal_pad``); ``pad + slot`` is one
    signal. Signals are *pushed*: a rank writes into the peer's pad, the peer polls its own
    copy (a local load, the cheap side).
epoch
    Signals only grow. A wait asks for ``slot >= epoch``, so pads never need resetting:
    launch ``k`` uses epoch ``k`` (``DeviceHeap.next_epoch()``), as every rank launches the
    same sequence.
bounded waits
    A wait that expires (after ``DeviceHeap.timeout``, the handle's ``TIMEOUT_NS``) records
    who waited on whom in the handle's error words (see :mod:`tilecomm.device.errors`) and
    returns False; the host turns the record into :class:`tilecomm.CommTimeout`
    (``DeviceHeap.check``).

Memory model
------------
``signal_set`` / ``signal_add`` are *release* atomics at *system* scope; ``wait_ge`` and
``barrier`` read with *acquire* loads at system scope. So every store a program made before
signalling (including ``put`` into the peer's memory) is visible to the peer's program once its
wait returns True. Why:

* release/acquire, not relaxed + fences: Triton 3.9 lowers them to ``atom.release.sys`` /
  ``ld.relaxed.sys`` + ``fence.acquire.sys`` on sm_90 (the compatibility path below: the same
  release atomics, ``ld.acquire.sys`` / ``atom.acquire.sys``), and it puts a CTA barrier
  (``bar.sync``) before a scalar atomic and after broadcasting a scalar load, so the release
  covers the stores of *all* threads of the program, and all threads see what the acquire saw.
* ``scope="sys"``: peers are other processes, possibly on other GPUs (NVLink / PCIe peer
  memory) or the CPU heap; ``gpu`` scope would only order accesses within one device.
* Signals are integer atomics: the interpreter implements integer atomics with real CPU atomic
  instructions (atomic across processes on shared memory); its fp16/bf16 atomics are not.

On the CPU (interpreter) x86-64 is TSO and the atomics are locked instructions, which is
stronger than the above.

Compatibility path (Triton without ``tl.atomic_load`` / ``tl.atomic_poll``: 3.6 checked)
---------------------------------------------------------------------------------------
Chosen once at import (:data:`COMPAT`): by feature detection (``hasattr(tl, "atomic_poll")``
and ``"atomic_load"``), never a version string, or forced with ``TILECOMM_DEVICE_COMPAT=1``
(:mod:`tilecomm.settings`; CI runs tests/device/test_device_compat.py that way under 3.9).
Same public functions, same promises; only three private helpers differ
(``_load_acquire``, ``_load_relaxed``, ``_poll``), plus ``_before_release``:

* acquire load = ``tl.atomic_add(p, 0, sem="acquire", scope="sys")``. For a scalar Triton
  (3.6 and 3.9) folds the add of 0 into a plain acquire load, ``ld.global.sys.acquire.b64``
  by one thread, broadcast through shared memory with a ``bar.sync`` (3.9's native path:
  ``ld.relaxed.sys`` + ``fence.acquire.sys``, same broadcast). For ``barrier``'s vector of
  slots it stays a per-lane ``atom.global.sys.acquire.add.u64`` of 0 (an RMW that writes the
  value it read; signals only grow, so it never loses a peer's update), followed by the same
  ``bar.sync`` before any data access. compile_check's ordering check treats an acquire
  ``ld``/``atom`` like a ``fence.acquire``.
* relaxed load of the error word = ``tl.atomic_add(heap + H_ERR, 0, sem="relaxed",
  scope="gpu")`` (``ld.global.gpu.relaxed``, broadcast): the same value in every thread, so
  the wait loops stay uniform across the CTA (their bodies hold ``bar.sync``).
* release: ``signal_set`` / ``signal_add`` are the same release atomics, but Triton 3.6 puts
  no ``bar.sync`` before a scalar atomic whose result is unused (3.9 does), so the compat path
  issues one (``tl.debug_barrier``) right before the atomic: the release again covers every
  thread's stores. (Under 3.9 with the switch on there are two in a row; harmless.)
* bounded poll (``_poll``): all threads spin on ``tl.load(p, volatile=True)``
  (``ld.volatile.global``, which the PTX memory model treats as relaxed at system scope),
  until the slot is ``>= epoch`` or ``SLICE_NS`` passed on the GPU global timer
  (``mov.u64 %globaltimer``, inline asm, not pure) -- the loop 3.9's ``tl.atomic_poll``
  compiles to (there: ``ld.relaxed.sys``, exit on ``==``). No barrier inside, so threads may
  leave it at different iterations; the acquire load after it re-synchronizes them.
  Interpreter: no inline assembly, so the timer is Python's ``time.perf_counter_ns()``, the
  clock 3.9's interpreted ``tl.atomic_poll`` uses. The wait's time bound is unchanged.

Bounded waits
-------------
A wait polls with ``tl.atomic_poll`` (compat path: a volatile-load spin; either way timed by
the GPU global timer, or the CPU clock in the interpreter) in slices of ``SLICE_NS`` for
``TIMEOUT_NS // SLICE_NS + 1`` slices (the handle's wait bound), re-checking ``>=`` with an
acquire load after each: the total wait is at least the bound and never endless.
A wait first looks at the error record: once a wait of the launch has given up, later waits of this
rank's launch return False at once (no chain of timeouts).

Interpreter limits (see docs/device-api.md)
------------------------------------------
The interpreter runs a grid's programs one after another: a program may wait on peers' programs
and on earlier programs of its own launch, never on a later one.
"""

from __future__ import annotations

import os
import time

import triton
import triton.language as tl

from . import errors as _e
from . import handle as _h
from ..settings import settings as _settings

#: True when kernels run in the Triton interpreter (TRITON_INTERPRET=1 at import).
INTERPRETED = os.environ.get("TRITON_INTERPRET", "0").lower() in ("1", "true", "yes", "on")

#: True when this Triton has the primitives the native path uses (``tl.atomic_load``,
#: ``tl.atomic_poll``: Triton 3.9+). Feature detection, never a version string.
NATIVE_AVAILABLE = all(hasattr(tl, n) for n in ("atomic_load", "atomic_poll"))

#: True when this process uses the compatibility path (see "Compatibility path" above):
#: chosen once, at import, because this Triton lacks the native primitives or because
#: TILECOMM_DEVICE_COMPAT=1 forces it (CI tests it under 3.9 that way).
COMPAT = (not NATIVE_AVAILABLE) or _settings().device_compat

if INTERPRETED:
    # NOTE [interpreter scalar index, Triton 3.6]: range() over kernel scalars with NumPy 2.4
    from .interpreter import (cache_builtin_members, index_scalars_like_triton39,
                              patch_once_per_launch)
    index_scalars_like_triton39()
    # NOTE [interpreter launch cost]: the language's builtins listed once, and patched once
    # per launch, not again at every device function's call
    cache_builtin_members()
    patch_once_per_launch()

#: Length of one poll slice. On the GPU a slice is a spin on the global timer, short enough
#: that a signal that jumped past the awaited epoch (so equality never matched) costs little;
#: in the interpreter each loop iteration costs ~0.2 ms of Python anyway.
SLICE_NS = tl.constexpr(1_000_000 if INTERPRETED else 2_000)

ERR_CODE = tl.constexpr(_e.CODE)
WAIT_TIMEOUT = tl.constexpr(_e.WAIT_TIMEOUT)
BARRIER_TIMEOUT = tl.constexpr(_e.BARRIER_TIMEOUT)
ABORTED = tl.constexpr(_e.ABORTED)

# words of the device handle (tilecomm.device.handle)
H_RANK = tl.constexpr(_h.RANK)
H_WORLD = tl.constexpr(_h.WORLD)
H_TIMEOUT_NS = tl.constexpr(_h.TIMEOUT_NS)
H_SELF_BASE = tl.constexpr(_h.SELF_BASE)
H_ERR = tl.constexpr(_h.ERR)
H_ABORT = tl.constexpr(_h.ABORT)
H_BASES = tl.constexpr(_h.BASES)

#: every heap base (``DeviceHeap.bases``) is a multiple of this many bytes (CUDA allocations
#: and mmap'd shared-memory segments are); ``peer_ptr`` relies on it for alignment hints
HEAP_ALIGN = tl.constexpr(256)

#: ``op`` of put_signal
SIGNAL_SET = tl.constexpr(0)
SIGNAL_ADD = tl.constexpr(1)


# --- the two paths: the only place lang.py touches Triton's atomic loads and polls -------------
# Both define _load_acquire / _load_relaxed / _poll with the same meaning; the functions below
# call only these. Chosen once, at import (COMPAT).

if not COMPAT:
    @triton.jit
    def _load_acquire(p, mask=None):
        """``*p`` (a pointer or block of pointers), acquire, system scope."""
        return tl.atomic_load(p, mask=mask, sem="acquire", scope="sys")

    @triton.jit
    def _load_relaxed(p):
        """``*p`` (a scalar pointer to this device's memory), relaxed, gpu scope."""
        return tl.atomic_load(p, sem="relaxed", scope="gpu")

    @triton.jit
    def _poll(p, target, slice_ns):
        """Return once ``*p == target`` (relaxed, system scope) or after about ``slice_ns``."""
        tl.atomic_poll(p, target, sem="relaxed", scope="sys", timeout_ns=slice_ns)

    @triton.jit
    def _before_release():
        """Nothing: Triton 3.9 puts a CTA barrier before every scalar atomic itself."""
        pass

else:
    if INTERPRETED:
        def _clock_ns():
            # the interpreter runs kernels as Python and has no inline assembly: its CPU clock
            # (the one its tl.atomic_poll uses in Triton 3.9) stands in for the global timer
            return time.perf_counter_ns()

        @triton.jit
        def _now_ns():
            return tl.cast(_clock_ns(), tl.int64)
    else:
        @triton.jit
        def _now_ns():
            # the GPU global timer (ns); not pure: every call reads it anew
            return tl.inline_asm_elementwise("mov.u64 $0, %globaltimer;", "=l", [],
                                             dtype=tl.int64, is_pure=False, pack=1)

    @triton.jit
    def _load_acquire(p, mask=None):
        """``*p``, acquire, system scope: an atomic add of 0 that returns the value (Triton
        lowers the scalar one to ``ld.acquire.sys``, a block of them to
        ``atom.acquire.sys.add`` of 0 per lane)."""
        zero = tl.cast(0, p.dtype.element_ty)
        return tl.atomic_add(p, zero, mask=mask, sem="acquire", scope="sys")

    @triton.jit
    def _load_relaxed(p):
        """``*p`` (this device's memory), relaxed, gpu scope: an atomic add of 0 (a relaxed
        ``ld``); as a scalar atomic, its value is the same in every thread."""
        return tl.atomic_add(p, tl.cast(0, p.dtype.element_ty), sem="relaxed", scope="gpu")

    @triton.jit
    def _poll(p, target, slice_ns):
        """Spin until ``*p >= target`` or about ``slice_ns`` passed on the global timer.

        Volatile loads (``ld.volatile``: relaxed, system scope in the PTX memory model; no
        CTA barrier, so the threads may leave the loop at different iterations, as in
        ``tl.atomic_poll``); the caller re-reads the slot with an acquire load."""
        t0 = _now_ns()
        v = tl.load(p, volatile=True)
        while (v < target) & (_now_ns() - t0 < slice_ns):
            v = tl.load(p, volatile=True)

    @triton.jit
    def _before_release():
        """A CTA barrier (``bar.sync``), so a scalar release atomic, issued by one thread,
        publishes every thread's earlier stores: Triton 3.6 puts none before a scalar atomic
        whose result is unused."""
        tl.debug_barrier()


@triton.jit
def my_rank(heap):
    """This rank's number (int32), from the device handle ``heap``."""
    return tl.load(heap + H_RANK).to(tl.int32)


@triton.jit
def world_size(heap):
    """The number of ranks of the heap (int32), from the device handle ``heap``. A kernel
    that unrolls over the ranks takes the world size as a constexpr instead."""
    return tl.load(heap + H_WORLD).to(tl.int32)


@triton.jit
def peer_ptr(ptr, peer, heap):
    """Rank ``peer``'s address of the symmetric pointer (or block of pointers) ``ptr``.

    ``ptr`` points into this rank's heap; the result has the same type and points at the same
    offset of ``peer``'s heap, as mapped in this process. ``peer == rank`` gives ``ptr``.
    Translate the scalar base once and add offsets afterwards (``peer_ptr(x, ...) + offs``):
    that costs two scalar loads from the handle instead of a block of them. Neither waits for
    the load of the rank: the handle keeps this rank's base in a word of its own.

    Alignment: heap bases are ``HEAP_ALIGN`` (256) byte aligned (CUDA allocations and IPC
    mappings are, mmap'd shared-memory segments are page aligned; tests/device checks the
    CPU heap's), so the rebasing delta is hinted a multiple of 256 and the result keeps the
    alignment the compiler knows for ``ptr``: a 16-byte aligned ``ptr`` (Triton's pointer
    specialization, or a ``tl.multiple_of`` offset) gives 128-bit peer accesses. Without the
    hint every peer access was scalar.
    """
    delta = tl.multiple_of(tl.load(heap + H_BASES + peer) - tl.load(heap + H_SELF_BASE),
                           HEAP_ALIGN)
    raw = tl.cast(ptr, tl.pointer_type(tl.int8)) + delta     # byte arithmetic keeps provenance
    return tl.cast(raw, ptr.dtype)


@triton.jit
def put(dst, src, offs, mask, peer, heap):
    """Copy ``src[offs]`` (local memory, any pointer) to ``peer``'s ``dst[offs]`` (``dst`` a
    symmetric pointer), elements where ``mask`` holds. Plain stores: not visible to the peer
    until a following ``signal_*`` (release) that it waits for."""
    vals = tl.load(src + offs, mask=mask)
    tl.store(peer_ptr(dst, peer, heap) + offs, vals, mask=mask)


@triton.jit
def get(dst, src, offs, mask, peer, heap):
    """Copy ``peer``'s ``src[offs]`` (``src`` a symmetric pointer) to local ``dst[offs]``,
    elements where ``mask`` holds. Only meaningful after a wait that acquired the peer's
    signal published after it wrote ``src``."""
    vals = tl.load(peer_ptr(src, peer, heap) + offs, mask=mask)
    tl.store(dst + offs, vals, mask=mask)


@triton.jit
def signal_set(pad, slot, value, peer, heap):
    """Store ``value`` into ``peer``'s signal ``pad[slot]`` (release, system scope) and return
    the old value. Everything this program stored before is visible to a peer that acquires
    the new value. ``peer == rank`` signals this rank's own pad."""
    p = peer_ptr(pad, peer, heap) + slot
    _before_release()
    return tl.atomic_xchg(p, tl.cast(value, pad.dtype.element_ty), sem="release", scope="sys")


@triton.jit
def signal_add(pad, slot, value, peer, heap):
    """Add ``value`` to ``peer``'s signal ``pad[slot]`` (release, system scope); returns the old
    value. Use it for counters several ranks bump (e.g. "arrivals >= world - 1")."""
    p = peer_ptr(pad, peer, heap) + slot
    _before_release()
    return tl.atomic_add(p, tl.cast(value, pad.dtype.element_ty), sem="release", scope="sys")


@triton.jit
def read_signal(pad, slot):
    """This rank's ``pad[slot]`` (acquire, system scope), without waiting."""
    return _load_acquire(pad + slot)


@triton.jit
def _record(heap, code, peer, epoch, slot, observed, site):
    """Claim the error record (first failure of the launch wins) and count the failure."""
    err = heap + H_ERR
    zero = tl.cast(0, tl.int64)
    prev = tl.atomic_cas(err, zero, tl.cast(code, tl.int64), sem="relaxed", scope="gpu")
    if prev == 0:
        tl.store(err + 1, tl.load(heap + H_RANK))
        tl.store(err + 2, tl.cast(peer, tl.int64))
        tl.store(err + 3, tl.cast(epoch, tl.int64))
        tl.store(err + 4, tl.cast(slot, tl.int64))
        tl.store(err + 5, tl.cast(observed, tl.int64))
        tl.store(err + 6, tl.cast(site, tl.int64))
    tl.atomic_add(err + 7, tl.cast(1, tl.int64), sem="relaxed", scope="gpu")


@triton.jit
def _given_up(heap, abort):
    """Nonzero once a wait of this launch gave up or the communicator was aborted (NOTE
    [device abort] in device/heap.py): the error word, or'ed with the abort word."""
    return _load_relaxed(heap + H_ERR) | _load_relaxed(abort)


@triton.jit
def _record_end(heap, abort, code, peer, epoch, slot, observed, site):
    """Record why a wait ended unsatisfied: the abort (``observed``: the abort word) or its
    own ``code``."""
    cut = _load_relaxed(abort)
    if cut != 0:
        _record(heap, ABORTED, peer, epoch, slot, cut, site)
    else:
        _record(heap, code, peer, epoch, slot, observed, site)


@triton.jit
def _wait(pad, slot, epoch, peer, heap, code, site):
    p = pad + slot
    target = tl.cast(epoch, pad.dtype.element_ty)
    v = _load_acquire(p)
    if v < target:
        slices = tl.load(heap + H_TIMEOUT_NS) // SLICE_NS + 1
        abort = heap + tl.load(heap + H_ABORT)
        i = tl.cast(0, tl.int64)
        failed = _given_up(heap, abort)
        while (v < target) & (i < slices) & (failed == 0):
            # returns early when the slot equals target; a slot that jumped past it is caught
            # by the >= test on the acquire load below, one slice later at most
            _poll(p, target, SLICE_NS)
            v = _load_acquire(p)
            failed = _given_up(heap, abort)
            i += 1
        if v < target:
            _record_end(heap, abort, code, peer, epoch, slot, v, site)
    return v >= target


@triton.jit
def wait_ge(pad, slot, epoch, peer, heap, site: tl.constexpr = 0):
    """Wait until this rank's ``pad[slot] >= epoch`` (acquire, system scope); True if it did.

    ``peer`` is the rank expected to signal (only reported on failure). After the handle's
    wait bound (``DeviceHeap.timeout``), or at once if an earlier wait of this launch already
    failed, the wait records ``(rank, peer, epoch, slot, observed value, site)`` in the
    handle's error words and returns False: the program should then skip what depended on the
    signal and exit; the host raises :class:`tilecomm.CommTimeout` from ``DeviceHeap.check``.
    ``site`` (constexpr) tags the wait in the error message.
    """
    return _wait(pad, slot, epoch, peer, heap, WAIT_TIMEOUT, site)


@triton.jit
def barrier(pad, slot0, epoch, heap, WORLD: tl.constexpr, group=-1, site: tl.constexpr = 0):
    """Barrier among the ranks of ``group`` (bit ``r`` set = rank ``r`` takes part; -1: all of
    ``0..WORLD-1``). Returns True if every member arrived at ``epoch``.

    Uses ``WORLD`` slots ``pad[slot0 : slot0 + WORLD]`` on every member: rank ``r`` sets slot
    ``slot0 + r`` of every other member to ``epoch`` (release), then waits until each member's
    slot in its own pad is ``>= epoch`` (acquire). So it also orders memory: what a member
    stored before the barrier is visible to every member after it. Each call needs a larger
    ``epoch`` than the previous call on the same slots. It synchronizes *this program* with
    the program of the same id on the other ranks: programs of one grid that call barrier
    concurrently need distinct ``slot0`` ranges. ``WORLD`` is a constexpr; subsets are limited
    to ranks 0..63.

    One lane per rank (a ``WP2 = next_pow2(WORLD)`` vector), not a loop over peers:

    * **signal**: a CTA barrier (``bar.sync``: every thread's earlier stores happen before
      it), then *one* vector ``atomic_xchg(release, sys)`` whose lane ``p`` writes peer ``p``'s
      slot (masked to the other members). In the PTX this is a single predicated
      ``atom.global.release.sys.exch.b64`` executed by the first ``WP2`` threads of warp 0:
      one release (one ``MEMBAR.SYS`` for the warp), all remote writes in flight together,
      instead of ``WORLD - 1`` scalar release atomics one after another (each its own fence
      and remote round trip).
    * **wait**: one vector acquire load of all members' slots in this rank's pad per round;
      while some member is short it sleeps on the first late one (``tl.atomic_poll`` on that
      slot, or the compat path's spin, ``SLICE_NS`` per slice, bounded by the handle's wait bound as
      :func:`wait_ge`) and loads them all again; then a ``bar.sync`` so every thread's
      later loads follow the acquire.
    * A barrier that gives up records one failure (``BARRIER_TIMEOUT``): the lowest late
      member as the peer, its slot and the value it held.
    """
    WP2: tl.constexpr = triton.next_power_of_2(WORLD)
    lane = tl.arange(0, WP2)
    lane64 = tl.cast(lane, tl.int64)
    rank = my_rank(heap)
    g = tl.cast(group, tl.int64)
    peers = (lane < WORLD) & (((g >> lane64) & 1) != 0) & (lane != rank)
    target = tl.cast(epoch, pad.dtype.element_ty)
    # signal: pad rebased into every member's heap (one lane each), slot slot0 + rank
    delta = tl.load(heap + H_BASES + lane, mask=lane < WORLD, other=0) - \
        tl.load(heap + H_SELF_BASE)
    delta = tl.multiple_of(delta, HEAP_ALIGN)
    remote = tl.cast(tl.cast(pad, tl.pointer_type(tl.int8)) + delta, pad.dtype) + slot0 + rank
    tl.debug_barrier()              # every thread's stores are ordered before the release
    tl.atomic_xchg(remote, tl.full((WP2,), 0, pad.dtype.element_ty) + target, mask=peers,
                   sem="release", scope="sys")
    # wait: all members' slots of this rank's pad at once
    own = pad + slot0 + lane
    v = _load_acquire(own, peers)
    late = peers & (v < target)
    n_late = tl.sum(late.to(tl.int32), 0)
    if n_late > 0:
        slices = tl.load(heap + H_TIMEOUT_NS) // SLICE_NS + 1
        abort = heap + tl.load(heap + H_ABORT)
        i = tl.cast(0, tl.int64)
        failed = _given_up(heap, abort)
        while (n_late > 0) & (i < slices) & (failed == 0):
            first = tl.min(tl.where(late, lane, WP2), 0)
            # returns early when that slot equals target; one that jumped past it is caught by
            # the >= test on the acquire load below, one slice later at most
            _poll(pad + slot0 + first, target, SLICE_NS)
            failed = _given_up(heap, abort)
            v = _load_acquire(own, peers)
            late = peers & (v < target)
            n_late = tl.sum(late.to(tl.int32), 0)
            i += 1
        if n_late > 0:
            first = tl.min(tl.where(late, lane, WP2), 0)
            seen = tl.sum(tl.where(lane == first, v, 0), 0)
            _record_end(heap, abort, BARRIER_TIMEOUT, first, epoch, slot0 + first, seen, site)
    tl.debug_barrier()              # every thread's later loads follow the acquire
    return n_late == 0

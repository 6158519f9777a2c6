"""Compile Triton kernels for a CUDA target (sm_90 by default) on a machine without a GPU.

``triton.compile`` with an explicit ``GPUTarget`` runs the whole NVIDIA pipeline
(TTIR -> TTGIR -> LLVM IR -> PTX, and cubin with the ptxas that ships in the triton wheel),
so GPU-only errors (unsupported atomics, layout problems, register blow-ups that ptxas
rejects) fail on the CPU CI machine.

Python::

    from tilecomm.device.compile_check import compile_for
    compile_for(kernel, {"x": "*fp32", "n": "i32", "BLOCK": "constexpr"}, {"BLOCK": 128})

Command line (compiles every ``COMPILE`` entry of the given modules / files)::

    python -m tilecomm.device.compile_check [--jobs N] examples/device/*.py

A module lists its kernels as ``COMPILE = [(kernel, signature, constexprs), ...]``;
signature types are Triton's: ``*fp32``, ``*i64`` (pointers), ``i32``, ``i64``, ``fp32``
(scalars) and ``constexpr``. The kernels must be JIT functions, not interpreted ones, so this
refuses to run under ``TRITON_INTERPRET=1``.

What a real launch compiles (``offline_target``, ``record_launches``, ``compile_launch``)
---------------------------------------------------------------------------------------
A ``COMPILE`` entry fixes the signature by hand and gives no argument attributes, so it shows
neither Triton's *specialization* of a launch (integer arguments equal to 1 become constants,
integers and pointers divisible by 16 get ``tt.divisibility``) nor the code a launch with
16-byte aligned tensors gets. :func:`offline_target` makes Triton's own launch path
(``JITFunction.run``: the argument binder, ``specialize_impl``, the cache key, the attributes)
believe it runs on ``cuda:sm_<arch>``: a stand-in for ``triton.runtime.driver.active`` reports
that target, a device name of its own and stream 0. Inside it:

* ``kernel.warmup(*args, grid=...)`` / ``kernel.run(*args, grid=..., warmup=True)`` compiles
  what ``kernel[grid](*args)`` would and caches it under the key a launch computes, so
  :func:`compiled_variants` counts the variants a sequence of launches produced;
* :func:`record_launches` lets the launchers themselves run (``kernel[grid](...)``): Triton's
  ``jit_cache_hook`` records each launch's cache key, signature, constants and attributes and
  tells Triton to skip compiling (so nothing is launched); :func:`compile_launch` compiles a
  recorded launch for sm_<arch> exactly as Triton would have.

Nothing runs on a device: the compiled kernels are for reading (``.asm["ptx"]``), not launching.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import os
import re
import sys
import time
from dataclasses import dataclass, field


def cuda_backend_available() -> str | None:
    """None if triton can compile for CUDA here, else why not."""
    try:
        import triton.backends as tb
    except ImportError as e:
        return f"triton is not installed ({e})"
    if "nvidia" not in getattr(tb, "backends", {}):
        return "this triton has no NVIDIA backend"
    return None


def compile_for(kernel, signature: dict, constexprs: dict | None = None, *, arch: int = 90,
                warp_size: int = 32, options: dict | None = None):
    """Compile ``kernel`` for ``cuda:sm_<arch>``; returns the CompiledKernel (``.asm`` holds
    ``ttir``, ``ttgir``, ``llir``, ``ptx`` and ``cubin``). Raises on any compile error."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    if not isinstance(kernel, triton.runtime.JITFunction):
        raise TypeError(f"{getattr(kernel, '__name__', kernel)!r} is not a JIT function (was "
                        f"it imported under TRITON_INTERPRET=1?)")
    sig = dict(signature)
    for name in (constexprs or {}):
        sig.setdefault(name, "constexpr")
    src = ASTSource(fn=kernel, signature=sig, constexprs=dict(constexprs or {}))
    return triton.compile(src, target=GPUTarget("cuda", arch, warp_size), options=options)


class _OfflineDriver:
    """Stands in for ``triton.runtime.driver.active`` on a machine without a GPU: reports
    ``target`` and a device of its own (its kernel cache is separate from any real device's).
    Launching is impossible: ``CompiledKernel.run`` would need the real driver."""

    def __init__(self, target):
        self.target = target
        self.device = f"offline-{target.backend}-sm{target.arch}"

    def get_current_target(self):
        return self.target

    def get_current_device(self):
        return self.device

    def get_current_stream(self, device=None):
        return 0


@contextlib.contextmanager
def offline_target(arch: int = 90, warp_size: int = 32):
    """Within: Triton's launch path (``JITFunction.run``) binds, specializes and compiles for
    ``cuda:sm_<arch>`` (see the module docstring). Yields the device name its kernel caches
    use (``kernel.device_caches[name]``)."""
    from triton.backends.compiler import GPUTarget
    from triton.runtime.driver import driver

    stub = _OfflineDriver(GPUTarget("cuda", arch, warp_size))
    prev = driver._active
    driver.set_active(stub)
    try:
        yield stub.device
    finally:
        driver._active = prev


def compiled_variants(kernel, arch: int = 90, warp_size: int = 32) -> list[str]:
    """Cache keys of the variants of ``kernel`` compiled under :func:`offline_target`."""
    from triton.backends.compiler import GPUTarget

    dev = _OfflineDriver(GPUTarget("cuda", arch, warp_size)).device
    if dev not in kernel.device_caches:
        return []
    return list(kernel.device_caches[dev][0])


@dataclass
class Launch:
    """One launch seen by :func:`record_launches`: what Triton would compile for it."""
    kernel: object                 # the JITFunction
    key: str                       # Triton's cache key of the launch (its specialization)
    signature: dict
    constants: dict
    attrs: dict
    options: dict = field(default_factory=dict)

    @property
    def name(self) -> str:
        return self.kernel.__name__


@contextlib.contextmanager
def record_launches(arch: int = 90, warp_size: int = 32):
    """Run launchers (``kernel[grid](...)``) without a GPU: within, every launch goes through
    Triton's binder and specialization for ``cuda:sm_<arch>``, is appended to the yielded
    list as a :class:`Launch` and is *not* compiled nor run (``jit_cache_hook`` says so).
    Outputs stay unwritten; use it on launchers only for what they pass to the kernel."""
    from triton import knobs

    seen: list[Launch] = []

    def hook(*, key, fn, compile, **_):
        seen.append(Launch(fn.jit_function, key, dict(compile["signature"]),
                           dict(compile["constants"]), dict(compile["configs"][0]),
                           {k: compile[k] for k in ("num_warps", "num_ctas", "num_stages")}))
        return True                                  # skip the compile: launch nothing

    prev = knobs.runtime.jit_cache_hook
    knobs.runtime.jit_cache_hook = hook
    try:
        with offline_target(arch, warp_size):
            yield seen
    finally:
        knobs.runtime.jit_cache_hook = prev


def compile_launch(launch: Launch, arch: int = 90, warp_size: int = 32):
    """Compile a recorded launch for ``cuda:sm_<arch>`` as Triton would have (same signature,
    constants and argument attributes); returns the CompiledKernel."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    src = ASTSource(launch.kernel, launch.signature, launch.constants, launch.attrs)
    return triton.compile(src, target=GPUTarget("cuda", arch, warp_size),
                          options={k: v for k, v in launch.options.items() if v is not None})


_ACCESS = re.compile(r"^\s*(?:@!?%p\d+\s+)?(ld|st)\.global((?:\.[\w:]+)*)\s", re.M)


def global_accesses(ptx: str) -> "dict[tuple[str, int], int]":
    """Plain (non-atomic) global loads and stores of a PTX listing by width:
    ``{("ld", 128): count, ("st", 16): count, ...}``. Width = vector length x type bits
    (``ld.global.v4.b32`` and ``ld.global.nc.v2.b64`` are 128-bit). Strong accesses (``.relaxed``,
    ``.acquire``, ``.volatile``: atomic loads of signals) are left out."""
    out: dict = {}
    for m in _ACCESS.finditer(ptx):
        quals = m.group(2).split(".")[1:]
        if any(q in ("relaxed", "acquire", "release", "volatile") for q in quals):
            continue
        vec, bits = 1, 0
        for q in quals:
            if q in ("v2", "v4", "v8"):
                vec = int(q[1:])
            elif re.fullmatch(r"[busf]\d+", q):
                bits = int(q[1:])
        key = (m.group(1), vec * bits)
        out[key] = out.get(key, 0) + 1
    return out


_INSTR = re.compile(r"^\s*(?:@!?%p\d+\s+)?([a-z][\w.]*)")
_LABEL = re.compile(r"^\s*\$?[\w.$]+:")
#: debug-line labels (``$L__tmp3:``): no branch targets them, so they split no block (Triton
#: 3.6 emits them around inlined calls, e.g. between lang's bar.sync and its release atomic)
_DEBUG_LABEL = re.compile(r"^\s*\$L__tmp\d+:")


def ordering_problems(ptx: str) -> list[str]:
    """Memory-ordering checks on a kernel's PTX that the interpreter cannot make.

    * Every release atomic (``signal_set``/``signal_add``, the vector signal of
      ``lang.barrier``) must follow a ``bar.sync`` in the same basic block with no global
      store or atomic in between: the atomic is issued by one thread (or, in a barrier, by
      one lane per peer), and only the CTA barrier before it makes the *other* threads' data
      stores part of what the release publishes (PTX cumulativity). Loads in between (the
      peers' heap bases) are fine.
    * Every ``fence.acquire`` (the acquire half of a wait: one thread's scalar acquire load,
      or the lanes of ``lang.barrier``'s vector load), and every acquire ``ld`` / ``atom``
      (how lang's compatibility path acquires), must be followed by a ``bar.sync``
      *in its own block*, before any global load or store and before the block ends (a
      label, branch or ``ret``): the other threads' data loads must be ordered after the
      acquiring threads' fence, and a block that leaves the fence unsynchronized could reach
      data loads on another path. (Triton broadcasts the loaded value through shared memory
      with a ``bar.sync``; ``lang.barrier`` adds one after its wait.)

    Returns one line per violation (empty: fine). Triton emits these barriers today; this
    catches a compiler change or a primitive written without them."""
    out = []
    bar_ok = False          # a bar.sync since the last label / global access
    pending_acquire = None  # line of a fence.acquire not yet followed by bar.sync

    def unsynced(i, what):
        out.append(f"line {i}: {what} after fence.acquire (line {pending_acquire}) without a "
                   f"bar.sync between")

    for i, line in enumerate(ptx.splitlines(), 1):
        if _DEBUG_LABEL.match(line):
            continue
        if _LABEL.match(line) and not line.lstrip().startswith("//"):
            if pending_acquire is not None:
                unsynced(i, "end of block")
            bar_ok = False
            pending_acquire = None
            continue
        m = _INSTR.match(line)
        if not m:
            continue
        op = m.group(1)
        if op.startswith(("bar.sync", "barrier.sync")):
            bar_ok, pending_acquire = True, None
        elif op.startswith(("atom.", "red.")) and (".release" in op or ".acq_rel" in op):
            if not bar_ok:
                out.append(f"line {i}: {op} without a bar.sync before it in its block")
            bar_ok = False
        elif op.startswith("fence.acquire") or op.startswith("fence.acq_rel"):
            pending_acquire = i
        elif op.startswith(("ld.", "atom.")) and ".acquire" in op:
            # lang's compatibility path: the acquire is the load (ld.acquire) or a per-lane
            # atom.acquire add of 0 itself, not a fence after a relaxed load
            pending_acquire = i
            if op.startswith("atom."):
                bar_ok = False
        elif op.startswith(("st.global", "atom.", "red.", "ld.global", "bra", "ret")):
            if pending_acquire is not None and not op.startswith(("atom.", "red.")):
                unsynced(i, op)
                pending_acquire = None
            if not op.startswith("ld."):
                bar_ok = False
    return out


_SYNC_OP = re.compile(r"^\s*(?:@!?%p\d+\s+)?((?:atom|red|fence|membar|ld)\.[\w.:]*)", re.M)


def arithmetic_problems(ptx: str) -> list[str]:
    """Arithmetic that would not give the CPU executor's bits: an approximate division
    (Triton's ``/`` on fp32 lowers to ``div.approx.f32``/``div.full.f32``; avg must use
    ``tl.div_rn``, which lowers to ``div.rn``)."""
    return [f"approximate division ({op}): divide with tl.div_rn"
            for op in ("div.approx.f32", "div.full.f32", "div.approx.ftz.f32")
            if op in ptx]


def sync_counts(ptx: str) -> dict[str, int]:
    """Synchronizing instructions of a PTX listing (static count, one per line):

    ``release``: release atomics (``atom``/``red`` with ``.release`` or ``.acq_rel``) plus
    standalone release fences (``fence.sc``, ``fence.acq_rel``, ``fence.release``,
    ``membar``), each costs a fence at its scope; ``acquire``: ``fence.acquire`` (the
    acquire half of an acquire load, as Triton 3.9 lowers ``tl.atomic_load``), or an acquire
    ``ld`` / ``atom`` (how lang's compatibility path acquires); ``strong_loads``:
    ``ld.relaxed`` / ``ld.acquire`` loads (signal polls; ``ld.volatile`` spins not counted)."""
    c = {"release": 0, "acquire": 0, "strong_loads": 0}
    for m in _SYNC_OP.finditer(ptx):
        op = m.group(1)
        if op.startswith(("atom.", "red.")) and (".release" in op or ".acq_rel" in op):
            c["release"] += 1
        elif op.startswith(("fence.sc", "fence.acq_rel", "fence.release", "membar")):
            c["release"] += 1
        elif op.startswith("fence.acquire"):
            c["acquire"] += 1
        elif op.startswith("atom.") and ".acquire" in op:
            c["acquire"] += 1                  # lang's compat path: per-lane acquire add of 0
        elif op.startswith("ld.") and (".relaxed" in op or ".acquire" in op) and \
                ".global" in op:
            c["strong_loads"] += 1
            c["acquire"] += ".acquire" in op   # lang's compat path: ld.acquire, no fence
    return c


def load_module(spec: str):
    """A module by dotted name, or a Python file by path (tutorials start with digits)."""
    if spec.endswith(".py") or os.sep in spec:
        name = "_compile_check_" + os.path.splitext(os.path.basename(spec))[0]
        s = importlib.util.spec_from_file_location(name, spec)
        mod = importlib.util.module_from_spec(s)
        sys.modules[name] = mod
        s.loader.exec_module(mod)
        return mod
    return importlib.import_module(spec)


def _compile_entry(spec: str, i: int, arch: int) -> tuple[str, str | None]:
    """Compile entry ``i`` of ``spec``'s ``COMPILE`` list: ``(report line, error or None)``."""
    kernel, sig, consts = load_module(spec).COMPILE[i]
    name = f"{spec}:{kernel.__name__}"
    t = time.perf_counter()
    try:
        k = compile_for(kernel, sig, consts, arch=arch)
    except Exception as e:  # noqa: BLE001 - reported
        return f"FAIL {name}: {type(e).__name__}: {str(e)[:2000]}", f"{type(e).__name__}: {e}"
    bad = ordering_problems(k.asm["ptx"]) + arithmetic_problems(k.asm["ptx"])
    if bad:
        why = "; ".join(bad[:5])
        return f"FAIL {name} {consts}: memory ordering: {why}", "memory ordering: " + why
    return (f"ok   {name} sm_{arch}: {len(k.asm['ptx'])} B ptx, "
            f"{len(k.asm.get('cubin', b''))} B cubin ({time.perf_counter() - t:.1f} s)"), None


def check_modules(specs: list[str], arch: int = 90, out=print,
                  jobs: int = 1) -> list[tuple[str, str]]:
    """Compile every ``COMPILE`` entry of every module; returns ``(kernel, error)`` failures.

    ``jobs > 1`` compiles entries in that many worker processes (compiling is CPU-bound:
    LLVM and ptxas), reporting in completion order."""
    failures, work = [], []
    for spec in specs:
        entries = getattr(load_module(spec), "COMPILE", None)
        if not entries:
            failures.append((spec, "module has no COMPILE list"))
            continue
        work += [(spec, i) for i in range(len(entries))]

    def record(spec, i, line, err):
        out(line)
        if err is not None:
            kernel = load_module(spec).COMPILE[i][0]
            failures.append((f"{spec}:{kernel.__name__}", err))

    if jobs <= 1 or len(work) <= 1:
        for spec, i in work:
            record(spec, i, *_compile_entry(spec, i, arch))
        return failures
    import concurrent.futures as cf
    import multiprocessing as mp

    # spawn: workers start clean (no state inherited from a parent that may hold threads)
    with cf.ProcessPoolExecutor(max_workers=jobs, mp_context=mp.get_context("spawn")) as pool:
        futs = {pool.submit(_compile_entry, spec, i, arch): (spec, i) for spec, i in work}
        for f in cf.as_completed(futs):
            record(*futs[f], *f.result())
    return failures


def main(argv=None) -> int:
    import argparse

    p = argparse.ArgumentParser(prog="python -m tilecomm.device.compile_check",
                                description=__doc__.split("\n\n")[0])
    p.add_argument("modules", nargs="+", help="module names or .py files with a COMPILE list")
    p.add_argument("--arch", type=int, default=90, help="CUDA compute capability (90: H100/H200)")
    p.add_argument("-j", "--jobs", type=int, default=1,
                   help="compile in this many worker processes (default 1)")
    a = p.parse_args(argv)
    if os.environ.get("TRITON_INTERPRET", "0") not in ("", "0"):
        if "triton" in sys.modules:
            print("unset TRITON_INTERPRET: compiling needs JIT functions", file=sys.stderr)
            return 2
        os.environ.pop("TRITON_INTERPRET")
    why = cuda_backend_available()
    if why is not None:
        print(f"cannot compile for CUDA: {why}", file=sys.stderr)
        return 3
    failures = check_modules(a.modules, a.arch, jobs=a.jobs)
    print(f"{'FAILED' if failures else 'all compiled'}: {len(failures)} failure(s)")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())

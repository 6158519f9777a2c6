"""Compile Triton kernels for a CUDA target (sm_90 by default) on a machine without a GPU.

``triton.compile`` with an explicit ``GPUTarget`` runs the whole NVIDIA pipeline
(TTIR -> TTGIR -> LLVM IR -> PTX, and cubin with the ptxas that ships in the triton wheel),
so GPU-only errors (unsupported atomics, layout problems, register blow-ups that ptxas
rejects) fail on the CPU CI machine.

Python::

    from tilecomm.device.compile_check import compile_for
    compile_for(kernel, {"x": "*fp32", "n": "i32", "BLOCK": "constexpr"}, {"BLOCK": 128})

Command line (compiles every ``COMPILE`` entry of the given modules / files)::

    python -m tilecomm.device.compile_check examples/device/*.py

A module lists its kernels as ``COMPILE = [(kernel, signature, constexprs), ...]``;
signature types are Triton's: ``*fp32``, ``*i64`` (pointers), ``i32``, ``i64``, ``fp32``
(scalars) and ``constexpr``. The kernels must be JIT functions, not interpreted ones, so this
refuses to run under ``TRITON_INTERPRET=1``.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import re
import sys
import time


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


_INSTR = re.compile(r"^\s*(?:@!?%p\d+\s+)?([a-z][\w.]*)")
_LABEL = re.compile(r"^\s*\$?[\w.$]+:")


def ordering_problems(ptx: str) -> list[str]:
    """Memory-ordering checks on a kernel's PTX that the interpreter cannot make.

    * Every release atomic (``signal_set``/``signal_add``) must follow a ``bar.sync`` in the
      same basic block with no global store or atomic in between: the atomic is issued by one
      thread, and only the CTA barrier before it makes the *other* threads' data stores part
      of what the release publishes (PTX cumulativity).
    * Every ``fence.acquire`` (the acquire half of a wait) must be followed by a ``bar.sync``
      before the next global load or store in its block: the other threads' data loads must
      be ordered after the one thread's acquire.

    Returns one line per violation (empty: fine). Triton emits both barriers today; this
    catches a compiler change or a primitive written without them."""
    out = []
    bar_ok = False          # a bar.sync since the last label / global access
    pending_acquire = None  # line of a fence.acquire not yet followed by bar.sync
    for i, line in enumerate(ptx.splitlines(), 1):
        if _LABEL.match(line) and not line.lstrip().startswith("//"):
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
        elif op.startswith(("st.global", "atom.", "red.", "ld.global", "bra", "ret")):
            if pending_acquire is not None and op.startswith(("ld.global", "st.global")):
                out.append(f"line {i}: {op} after fence.acquire (line {pending_acquire}) "
                           f"without a bar.sync between")
                pending_acquire = None
            if not op.startswith("ld."):
                bar_ok = False
    return out


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


def check_modules(specs: list[str], arch: int = 90, out=print) -> list[tuple[str, str]]:
    """Compile every ``COMPILE`` entry of every module; returns ``(kernel, error)`` failures."""
    failures = []
    for spec in specs:
        mod = load_module(spec)
        entries = getattr(mod, "COMPILE", None)
        if not entries:
            failures.append((spec, "module has no COMPILE list"))
            continue
        for kernel, sig, consts in entries:
            name = f"{spec}:{kernel.__name__}"
            t = time.perf_counter()
            try:
                k = compile_for(kernel, sig, consts, arch=arch)
            except Exception as e:  # noqa: BLE001 - reported
                failures.append((name, f"{type(e).__name__}: {e}"))
                out(f"FAIL {name}: {type(e).__name__}: {str(e)[:2000]}")
                continue
            bad = ordering_problems(k.asm["ptx"])
            if bad:
                failures.append((name, "memory ordering: " + "; ".join(bad[:5])))
                out(f"FAIL {name} {consts}: memory ordering: {'; '.join(bad[:5])}")
                continue
            out(f"ok   {name} sm_{arch}: {len(k.asm['ptx'])} B ptx, "
                f"{len(k.asm.get('cubin', b''))} B cubin ({time.perf_counter() - t:.1f} s)")
    return failures


def main(argv=None) -> int:
    import argparse

    p = argparse.ArgumentParser(prog="python -m tilecomm.device.compile_check",
                                description=__doc__.split("\n\n")[0])
    p.add_argument("modules", nargs="+", help="module names or .py files with a COMPILE list")
    p.add_argument("--arch", type=int, default=90, help="CUDA compute capability (90: H100/H200)")
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
    failures = check_modules(a.modules, a.arch)
    print(f"{'FAILED' if failures else 'all compiled'}: {len(failures)} failure(s)")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())

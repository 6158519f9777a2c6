"""Make the Triton interpreter compute what a GPU computes, where it does not.

NOTE [interpreter bf16 rounding]
    The Triton interpreter (3.9) converts float32 to bfloat16 by *truncation*
    (``InterpreterBuilder.cast_impl`` calls ``_convert_float`` without a rounding mode), while a
    GPU rounds to nearest even (``cvt.rn.bf16.f32``), as torch and the CPU executor do.
    Unpatched, every kernel's bf16 reduction run in the interpreter differs from the GPU's (and
    the executor's) in the last bit. :func:`round_bf16_like_gpu` replaces that one conversion
    with torch's round-to-nearest-even; the Triton backend installs it in every rank process
    that runs kernels in the interpreter (``TILECOMM_CPU_KERNELS=triton``), and only there.

NOTE [interpreter scalar index, Triton 3.6]
    The Triton 3.6 interpreter holds a scalar as a one-element 1-D numpy array and converts it
    to a Python int (``range(first, n, step)`` over kernel scalars, as ``copy_blocks`` does) with
    ``int(array)``, which NumPy 2.4 refuses ("only 0-dimensional arrays can be converted").
    Triton 3.9 squeezes the array first. :func:`index_scalars_like_triton39` installs that
    conversion; ``tilecomm.device.lang`` calls it when it is imported under the interpreter.

NOTE [interpreter launch cost]
    Every interpreted launch patches ``triton.language`` for the interpreter and restores it
    after (``_patch_lang``): for each of ``tl``, ``tl.tensor``, ``tl.math``, ``tl.core`` it lists
    the module's members with ``inspect.getmembers`` and wraps the builtins. Listing and
    filtering were 20-30% of the CPU time of a rank running small kernels (py-spy over
    tests/kernels/test_conformance.py); the builtins of a module are the same at every launch.
    :func:`cache_builtin_members` lists them once per module and patches the same members with
    the same wrappers as before. Every call of a device function inside a kernel (``lang.wait``,
    ``lang.signal``, ...) patched the whole language again, although the launch had already
    patched it (another ~20%); :func:`patch_once_per_launch` skips that when the function sees
    no language module the launch has not patched. Both are installed with the scalar-index
    conversion above.
"""

from __future__ import annotations


def round_bf16_like_gpu() -> bool:
    """Patch the interpreter's float32 -> bfloat16 conversion to round to nearest even.
    Idempotent; returns False when this triton has no interpreter builder to patch."""
    import numpy as np
    import torch
    import triton.language as tl

    try:
        from triton.runtime import interpreter as itp
        builder = itp.InterpreterBuilder
        orig = builder.cast_impl
    except (ImportError, AttributeError):      # pragma: no cover - another triton layout
        return False
    if getattr(builder, "_tilecomm_rne", False):
        return True

    def cast_impl(self, src, dst_type):
        if src.dtype.scalar == tl.float32 and dst_type.scalar == tl.bfloat16:
            a = np.ascontiguousarray(src.data, dtype=np.float32)
            out = torch.from_numpy(a.reshape(-1)).to(torch.bfloat16).view(torch.int16)
            return itp.TensorHandle(out.numpy().view(np.uint16).reshape(a.shape),
                                    dst_type.scalar)
        return orig(self, src, dst_type)

    builder.cast_impl = cast_impl
    builder._tilecomm_rne = True
    return True


def index_scalars_like_triton39() -> bool:
    """Make the interpreter's ``tensor.__index__`` squeeze a one-element array before ``int``
    (see NOTE [interpreter scalar index, Triton 3.6]). Installed only where NumPy refuses
    ``int`` of a 1-D array (Triton 3.9 already squeezes: same result there). Idempotent;
    returns whether the conversion is installed."""
    import numpy as np

    try:
        int(np.zeros(1, dtype=np.int64))
        return False                              # this NumPy converts 1-element arrays
    except TypeError:
        pass
    try:
        from triton.runtime import interpreter as itp
        orig = itp._patch_lang_tensor
    except (ImportError, AttributeError):         # pragma: no cover - another triton layout
        return False
    if getattr(orig, "_tilecomm_index", False):
        return True

    def _patch_lang_tensor(tensor, scope):
        orig(tensor, scope)
        scope.set_attr(tensor, "__index__",
                       lambda self: int(np.asarray(self.handle.data).squeeze()))

    _patch_lang_tensor._tilecomm_index = True
    itp._patch_lang_tensor = _patch_lang_tensor
    return True


def cache_builtin_members() -> bool:
    """List each module's builtins once instead of at every interpreted launch (NOTE
    [interpreter launch cost]); the members patched and their wrappers are unchanged.
    Idempotent; returns False when this triton has no such patch step."""
    import inspect

    try:
        from triton.runtime import interpreter as itp
        orig = itp._patch_builtin
        is_builtin = itp.tl.core.is_builtin
    except (ImportError, AttributeError):         # pragma: no cover - another triton layout
        return False
    if getattr(orig, "_tilecomm_cached", False):
        return True
    listed: dict[int, tuple] = {}

    def _patch_builtin(pkg, builder, scope):
        # keyed by the module or class object (they live as long as the process); a member
        # that an earlier step of the same launch already wrapped is wrapped again around the
        # original: the same call, restored in reverse order
        members = listed.get(id(pkg))
        if members is None:
            members = listed[id(pkg)] = (pkg, tuple(
                (n, m) for n, m in inspect.getmembers(pkg) if is_builtin(m)))
        for name, member in members[1]:
            itp._patch_attr(pkg, name, member, builder, scope)

    _patch_builtin._tilecomm_cached = True
    itp._patch_builtin = _patch_builtin
    return True


def patch_once_per_launch() -> bool:
    """Inside an interpreted launch, a device function's call does not patch the language
    again when the launch already patched every language module the function sees (NOTE
    [interpreter launch cost]); outside a launch, and for a function that sees another
    module, Triton's patch runs as before. Idempotent; returns False when this triton has no
    such step."""
    try:
        from triton.runtime import interpreter as itp
        orig_patch, executor = itp._patch_lang, itp.GridExecutor
        orig_call, scope_type, tl = executor.__call__, itp._LangPatchScope, itp.tl
    except (ImportError, AttributeError):         # pragma: no cover - another triton layout
        return False
    if getattr(orig_patch, "_tilecomm_once", False):
        return True
    import inspect

    #: the language modules the running launch patched (None: no launch is running)
    patched: list = [None]
    seen: dict = {}

    def languages(fn) -> frozenset:
        got = seen.get(fn)
        if got is None:
            got = seen[fn] = frozenset(id(v) for v in fn.__globals__.values()
                                       if inspect.ismodule(v) and v in (tl, tl.core))
        return got

    def _patch_lang(fn):
        langs = languages(fn)
        if patched[0] is not None and langs and langs <= patched[0]:
            return scope_type()               # already in place for this launch
        scope = orig_patch(fn)
        if patched[0] is not None:
            patched[0] = patched[0] | langs
        return scope

    def __call__(self, *args, **kwargs):
        outer, patched[0] = patched[0], frozenset()
        try:
            return orig_call(self, *args, **kwargs)
        finally:
            patched[0] = outer

    _patch_lang._tilecomm_once = True
    # Triton's own steps, for tests that compare against them
    _patch_lang.triton, __call__.triton = orig_patch, orig_call
    itp._patch_lang = _patch_lang
    executor.__call__ = __call__
    return True

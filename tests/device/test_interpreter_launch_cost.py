"""NOTE [interpreter launch cost] (tilecomm.device.interpreter): the interpreter's language
patch with each module's builtins listed once must put in place, during a launch, what
Triton's own listing at every launch puts in place, undo it after, and give the same bits."""

from __future__ import annotations

import functools
import inspect

import pytest
import torch

import tilecomm.device.lang  # noqa: F401  (installs the patches under the interpreter)

pytestmark = pytest.mark.interpreter

triton = pytest.importorskip("triton")
tl = triton.language
itp = pytest.importorskip("triton.runtime.interpreter")

#: what the language patch touches
LANGUAGE = (tl, tl.core, tl.math, tl.tensor, tl.core.tensor_descriptor_base)


@triton.jit
def _add_one(x_ptr, n, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    tl.store(x_ptr + offs, tl.load(x_ptr + offs, mask=offs < n) + 1, mask=offs < n)


@triton.jit
def _mixed(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    m = offs < n
    x = tl.load(x_ptr + offs, mask=m, other=0.0)
    y = tl.where(x > 0, tl.math.exp(x), x * 2.0) + tl.sum(x, axis=0) + tl.max(x, axis=0)
    tl.store(y_ptr + offs, y.to(tl.bfloat16).to(tl.float32), mask=m)


def _listing_every_launch(pkg, builder, scope):
    """Triton's own step, the slow reference: list the members at every launch."""
    for name, member in inspect.getmembers(pkg):
        if tl.core.is_builtin(member):
            itp._patch_attr(pkg, name, member, builder, scope)


def _in_place(v):
    """A language attribute as a launch calls it: the builtin a wrapper calls, or the code of
    a replacement (fresh closures each launch), or the object itself."""
    member = (getattr(v, "__kwdefaults__", None) or {}).get("member")
    if inspect.isfunction(v) and v.__name__ == "<lambda>" and tl.core.is_builtin(member):
        return ("wraps", id(member))
    if inspect.isfunction(v):
        return ("code", v.__code__)
    if isinstance(v, property):
        return ("property", _in_place(v.fget))
    if isinstance(v, functools.partial):
        return ("partial", _in_place(v.func), v.args, tuple(v.keywords.items()))
    return ("is", id(v))


def _during_launch(fn) -> dict:
    """Every language attribute as a launch of ``fn`` finds it."""
    scope = itp._patch_lang(fn)
    try:
        return {(id(m), n): _in_place(v) for m in LANGUAGE for n, v in inspect.getmembers(m)
                if not n.startswith("__")}
    finally:
        scope.restore()


def _members() -> dict:
    return {(id(m), n): v for m in LANGUAGE for n, v in inspect.getmembers(m)
            if not n.startswith("__")}


def _run(kernel=None, programs: int = 1) -> torch.Tensor:
    """``kernel`` (default ``_mixed``) on 50 random floats, in ``programs`` programs."""
    x = torch.randn(50, generator=torch.Generator().manual_seed(3))
    y = torch.empty_like(x)
    (kernel or _mixed)[(programs,)](x, y, 50, BLOCK=64)
    return y


def test_listing_once_puts_in_place_what_listing_every_launch_does(monkeypatch):
    assert getattr(itp._patch_builtin, "_tilecomm_cached", False)     # installed
    before = _members()
    x = torch.zeros(10)
    _add_one[(1,)](x, 10, BLOCK=16)
    assert _members() == before and torch.equal(x, torch.ones(10))    # undone after a launch
    # A launch that calls a device function (tl.sum's combine) leaves the language patched
    # (Triton patches for the nested call and never restores it): one first, so that both
    # launches below start from the same state
    cached_bits = _run()
    cached = _during_launch(_mixed.fn)
    monkeypatch.setattr(itp, "_patch_builtin", _listing_every_launch)
    reference, reference_bits = _during_launch(_mixed.fn), _run()
    wrapped = sum(v[0] == "wraps" for v in reference.values())
    assert cached == reference and wrapped > 100, wrapped
    assert torch.equal(cached_bits.view(torch.int32), reference_bits.view(torch.int32))


@triton.jit
def _twice(x):
    # elementwise only: tl.sum's combine function sees tl.core, which Triton then patches
    # (and leaves patched) at its first call in a launch, whoever's patch step runs
    return tl.where(x > 100.0, x, x * 2 + 1)


@triton.jit
def _calls_a_device_function(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    m = offs < n
    x = tl.load(x_ptr + offs, mask=m, other=0.0)
    for _ in range(3):
        x = _twice(x)
    tl.store(y_ptr + offs, tl.where(x > 0, tl.math.exp(x * 1e-3), x), mask=m)


def _run_nested() -> torch.Tensor:
    return _run(_calls_a_device_function, programs=2)


def test_a_device_functions_call_patches_nothing_the_launch_already_patched(monkeypatch):
    """Triton patched the whole language again at every device function's call (and never
    undid it); inside a launch that already patched what the function sees, nothing is
    patched again, the language is as it was after the launch, and the bits are Triton's."""
    patch, call = itp._patch_lang, itp.GridExecutor.__call__
    assert getattr(patch, "_tilecomm_once", False)                   # installed
    listed = itp._patch_builtin
    patches = []
    monkeypatch.setattr(itp, "_patch_builtin", lambda *a: patches.append(a[0]) or listed(*a))
    _run_nested()                                 # Triton's leftovers from earlier launches
    before, patches[:] = _members(), []
    ours = _run_nested()
    once = len(patches)
    assert once > 0 and _members() == before
    monkeypatch.setattr(itp, "_patch_lang", patch.triton)
    monkeypatch.setattr(itp.GridExecutor, "__call__", call.triton)
    patches[:] = []
    theirs = _run_nested()
    # the launch, then 2 programs x 3 calls of _twice: 7 full patches in Triton's way
    assert len(patches) == 7 * once, (len(patches), once)
    assert torch.equal(ours.view(torch.int32), theirs.view(torch.int32))

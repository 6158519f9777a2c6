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


def _run() -> torch.Tensor:
    x = torch.randn(50, generator=torch.Generator().manual_seed(3))
    y = torch.empty_like(x)
    _mixed[(1,)](x, y, 50, BLOCK=64)
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

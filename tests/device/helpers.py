"""Helpers the device tests run inside rank processes (importable, so picklable)."""

from __future__ import annotations

import importlib.util
import os
import sys

EXAMPLES = os.path.join(os.path.dirname(__file__), "..", "..", "examples", "device")


EXAMPLES = os.path.join(os.path.dirname(__file__), "..", "..", "examples", "device")


def _interpret(comm):
    assert "tilecomm.device.lang" not in sys.modules, "kernels were imported without the interpreter"
    os.environ["TRITON_INTERPRET"] = "1"
    return os.getpid()


def tutorial(name: str):
    """The tutorial module ``examples/device/<name>.py`` (imported once per process)."""
    mod_name = "_tutorial_" + name
    if mod_name not in sys.modules:
        spec = importlib.util.spec_from_file_location(mod_name, os.path.join(EXAMPLES, name + ".py"))
        mod = importlib.util.module_from_spec(spec)
        sys.modules[mod_name] = mod
        spec.loader.exec_module(mod)
    return sys.modules[mod_name]


def run_tutorial(comm, name, *args, **kw):
    return tutorial(name).run(comm, *args, **kw)


def call(comm, fn, *args):
    """Run ``fn(comm, *args)``, then collect garbage: symmetric tensors are freed when their
    last view dies, and a view kept alive by a reference cycle (a traceback) on one rank only
    would make the next ``alloc`` diverge between ranks."""
    import gc

    try:
        return fn(comm, *args)
    finally:
        gc.collect()

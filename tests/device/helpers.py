"""Helpers the device tests run inside rank processes (importable, so picklable)."""

from __future__ import annotations

import importlib.util
import os
import sys

EXAMPLES = os.path.join(os.path.dirname(__file__), "..", "..", "examples", "device")


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

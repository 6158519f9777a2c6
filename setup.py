"""Builds the CPU executor's native runner (an optional C extension).

Everything else is declared in pyproject.toml. ``optional=True``: on a machine without a C
compiler the install still succeeds and the executor runs its plans in Python.
"""

from setuptools import Extension, setup

setup(ext_modules=[Extension(
    "tilecomm.backends.cpu._native",
    sources=["src/tilecomm/backends/cpu/_native.c"],
    # -ffp-contract=off: no fused multiply-add, so sums and averages round as numpy's do
    extra_compile_args=["-O3", "-ffp-contract=off", "-fno-strict-aliasing", "-std=c11"],
    optional=True,
)])

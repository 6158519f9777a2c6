"""The layers meet at public interfaces: no module reads another module's private names.

An AST scan of ``src/``, ``scripts/`` and ``benchmarks/``:

* ``obj._name`` fails unless ``obj`` is ``self``/``cls``/``super()`` or ``_name`` is defined in
  the same module (a module's privates are its own business): another object's underscore
  attribute is a reach past its interface (the Communicator's state goes through ``comm.host``);
* ``from tilecomm... import _name`` from another module fails;
* a module-level import cycle between two of tilecomm's modules fails (package ``__init__``
  re-exports and the schedules' registration with their registry aside).

The allowlist holds what cannot be otherwise, each entry with its reason.
"""

from __future__ import annotations

import ast
import os

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
SCANNED = ("src", "scripts", "benchmarks")

#: (path suffix, attribute or imported name): why it stays
ALLOWED = {
    ("launch.py", "_exit"): "os._exit: a forked rank must not run the parent's atexit handlers",
    ("orphan.py", "_exit"): "os._exit: the watchdog ends the process from a thread",
    ("fault_soak.py", "_exit"): "os._exit: a forked newcomer must not run its parent's "
                                "atexit handlers",
    ("torch/__init__.py", "_create_shrunk_process_group"):
        "dist.shrink_group's step that wraps only C++ backends (NOTE [shrink_group])",
    ("torch/__init__.py", "_set_group_name"): "the naming hook torch calls on a new group",
    ("torch/__init__.py", "_set_group_desc"): "the description hook torch calls on a new group",
    ("helpfmt.py", "_get_help_string"): "argparse's hook for help text, overridden by design",
    ("cli.py", "_plugins"): "torch.distributed.Backend._plugins: whether 'tilecomm' registered",
    ("torch/__init__.py", "_plugins"): "torch.distributed.Backend._plugins: no public query",
    ("torch/process_group.py", "_allgather_base"): "the name older torch releases call",
    ("torch/process_group.py", "_reduce_scatter_base"): "the name older torch releases call",
    ("hier/engine.py", "_allgather_base"): "the c10d group's flat all_gather (the world group "
                                           "is not registered with torch.distributed)",
    ("hier/engine.py", "_reduce_scatter_base"): "the c10d group's flat reduce_scatter (as above)",
    ("torch/process_group.py", "_register_atexit"):
        "threading._register_atexit: runs before the interpreter joins non-daemon threads",
    ("hier/rails.py", "_Options"): "ProcessGroupGloo._Options: the only way to bind Gloo to "
                                   "127.0.0.1 on simulated hosts",
    ("hier/rails.py", "_timeout"): "ProcessGroupGloo._Options fields (above)",
    ("hier/rails.py", "_devices"): "ProcessGroupGloo._Options fields (above)",
    ("device/compile_check.py", "_active"): "triton's driver registry: the CUDA target is "
                                            "set without a GPU to compile for sm_90",
    ("device/interpreter.py", "_patch_lang_tensor"): "the Triton interpreter's tensor patch, "
                                                     "wrapped to round bf16 as a GPU does",
    ("device/interpreter.py", "_tilecomm_index"): "a marker set on the wrapped patch above",
    ("device/interpreter.py", "_patch_attr"): "the Triton interpreter's one-builtin patch, "
                                              "called from the listing done once (NOTE "
                                              "[interpreter launch cost])",
    ("device/interpreter.py", "_tilecomm_cached"): "a marker set on that listing",
    ("device/interpreter.py", "_LangPatchScope"): "the Triton interpreter's record of a "
                                                  "language patch: an empty one where a "
                                                  "device function's call needs none",
    ("device/interpreter.py", "_tilecomm_once"): "a marker set on the once-per-launch patch",
    ("device/interpreter.py", "_tilecomm_rne"): "a marker set on the interpreter's builder",
    ("backends/triton/__init__.py", "_tilecomm_cooperative"):
        "a marker set on Triton's JITFunction by make_cooperative",
    ("gpucheck/baselines.py", "_symmetric_memory"): "torch.distributed._symmetric_memory is "
                                                    "where PyTorch keeps SymmetricMemory",
    ("backends/cpu/native.py", "_native"): "the C extension module itself (built at install)",
    ("cli.py", "_native"): "the C extension module: whether it was built",
}

#: import cycles that are a registration pattern (the registry imports the modules that
#: register themselves with it)
CYCLES_ALLOWED = {"tilecomm.algorithms.registry"}


def _files():
    for top in SCANNED:
        for dp, _, fs in os.walk(os.path.join(ROOT, top)):
            for f in sorted(fs):
                if f.endswith(".py"):
                    yield os.path.join(dp, f)


def _defined(tree) -> set[str]:
    """Underscore names a module defines: functions, classes, assignments, ``self._x = ...``,
    and class attributes."""
    names = set()
    for n in ast.walk(tree):
        if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(n.name)
        elif isinstance(n, ast.Attribute) and isinstance(n.ctx, ast.Store) and \
                isinstance(n.value, ast.Name) and n.value.id in ("self", "cls"):
            names.add(n.attr)
        elif isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store):
            names.add(n.id)
        elif isinstance(n, ast.arg):
            names.add(n.arg)
        elif isinstance(n, ast.alias):
            names.add(n.asname or n.name.split(".")[-1])
    return {x for x in names if x.startswith("_")}


def _allowed(path: str, name: str) -> bool:
    rel = os.path.relpath(path, ROOT).replace(os.sep, "/")
    return any(rel.endswith(suffix) and name == n for suffix, n in ALLOWED)


def _private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def test_no_module_reads_another_modules_private_names():
    found = []
    for path in _files():
        tree = ast.parse(open(path).read(), path)
        own = _defined(tree)
        rel = os.path.relpath(path, ROOT)
        for n in ast.walk(tree):
            if isinstance(n, ast.Attribute) and _private(n.attr):
                v = n.value
                if isinstance(v, ast.Name) and v.id in ("self", "cls"):
                    continue
                if isinstance(v, ast.Call) and isinstance(v.func, ast.Name) and \
                        v.func.id == "super":
                    continue
                if n.attr in own or _allowed(path, n.attr):
                    continue
                found.append(f"{rel}:{n.lineno}: {ast.unparse(n)}")
            elif isinstance(n, ast.ImportFrom):
                mod = n.module or ""
                if n.level == 0 and not mod.startswith("tilecomm"):
                    if any(_private(a.name) and not _allowed(path, a.name) for a in n.names):
                        found.append(f"{rel}:{n.lineno}: from {mod} import "
                                     f"{', '.join(a.name for a in n.names)}")
                    continue
                for a in n.names:
                    if _private(a.name) and not _allowed(path, a.name):
                        found.append(f"{rel}:{n.lineno}: from {'.' * n.level}{mod} import "
                                     f"{a.name}")
    assert not found, "private names read across modules:\n" + "\n".join(found)


def _module_graph():
    mods, files = {}, {}
    for path in _files():
        rel = os.path.relpath(path, os.path.join(ROOT, "src"))
        if rel.startswith(".."):
            continue
        m = rel[:-3].replace(os.sep, ".")
        pkg = m.endswith(".__init__")
        m = m[:-9] if pkg else m
        mods[m], files[m] = pkg, path
    graph = {m: set() for m in mods}
    for m, path in files.items():
        base = m if mods[m] else m.rsplit(".", 1)[0]
        for n in ast.parse(open(path).read()).body:        # module level: what runs at import
            targets = []
            if isinstance(n, ast.ImportFrom):
                if n.level:
                    parts = base.split(".")
                    parts = parts[:len(parts) - (n.level - 1)]
                    tgt = ".".join(parts + ([n.module] if n.module else []))
                else:
                    tgt = n.module or ""
                targets = [tgt + "." + a.name for a in n.names] + [tgt]
            elif isinstance(n, ast.Import):
                targets = [a.name for a in n.names]
            for t in targets:
                if t in mods and t != m and not mods[t]:     # into a package __init__: skip
                    graph[m].add(t)
                    break
    return graph


def test_no_import_cycles_between_modules():
    graph = _module_graph()
    cycles = []
    for a, outs in graph.items():
        for b in outs:
            if a < b and a in graph.get(b, ()) and not {a, b} & CYCLES_ALLOWED:
                cycles.append(f"{a} <-> {b}")
    assert not cycles, "modules that import each other:\n" + "\n".join(cycles)


def test_one_helper_says_which_field_the_ranks_disagree_on():
    """tilecomm.agree: named fields, one compare naming the field and each rank's value."""
    import pytest

    from tilecomm.agree import Descriptor, compare, disagreement
    from tilecomm.errors import CommMismatch
    d = Descriptor("op", "count", "dtype", show={"dtype": lambda v: ("f32", "bf16")[v]})
    rows = [d.pack(op=1, count=4, dtype=0), d.pack(op=1, count=4, dtype=1)]
    assert d.get(rows[1], "dtype") == 1 and len(d) == 3
    d.compare("x", rows, ("op", "count"))                    # they agree on these
    with pytest.raises(CommMismatch, match=r"^x: ranks disagree on dtype: rank 0: f32, "
                                           r"rank 1: bf16$"):
        d.compare("x", rows, ("op", "dtype", "count"))
    with pytest.raises(KeyError):
        d.pack(size=3)
    assert disagreement("y", "root", [0, 0]) is None
    assert disagreement("y", "root", [0, 1], ranks=[4, 6], who="ranks on different hosts") == \
        "y: ranks on different hosts disagree on root: rank 4: 0, rank 6: 1"
    with pytest.raises(CommMismatch, match="disagree on b"):
        compare("z", [[1, 2], [1, 3]], [(0, "a", str), (1, "b", str)])

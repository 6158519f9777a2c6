"""``tilecomm.sim`` reads schedules and their lowered plans only: no module imports a backend."""

import ast
from pathlib import Path

import tilecomm.sim

SIM = Path(tilecomm.sim.__file__).parent


def _backend_imports(path: Path) -> list[str]:
    tree = ast.parse(path.read_text(), str(path))
    pkg = ["tilecomm", "sim"]   # the package the module lives in (for relative imports)
    bad = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = pkg[:len(pkg) - node.level + 1] if node.level > 1 else pkg
                mod = ".".join(base + ([node.module] if node.module else []))
                # ``from .. import backends`` names the subpackage as an imported name
                names = [mod] + [f"{mod}.{a.name}" for a in node.names]
            else:
                names = [node.module or ""] + [f"{node.module}.{a.name}" for a in node.names]
        else:
            continue
        for n in names:
            if n == "tilecomm.backends" or n.startswith("tilecomm.backends."):
                bad.append(f"{path.name}:{node.lineno}: {n}")
                break
    return bad


def test_sim_imports_nothing_from_backends():
    mods = sorted(SIM.rglob("*.py"))
    assert len(mods) >= 10
    bad = [b for m in mods for b in _backend_imports(m)]
    assert not bad, "tilecomm.sim must not import tilecomm.backends:\n" + "\n".join(bad)


def test_the_check_catches_absolute_and_relative_imports(tmp_path):
    for src in ("import tilecomm.backends.cpu\n",
                "from tilecomm.backends.cpu.executor import X\n",
                "from tilecomm import backends\n",
                "from ..backends.cpu import plan\n",
                "from .. import backends\n",
                "def f():\n    from ..backends import cpu\n"):
        f = tmp_path / "m.py"
        f.write_text(src)
        assert _backend_imports(f), src
    for src in ("from ..algorithms.lower import lower\n", "from .engine import simulate\n",
                "import tilecomm.algorithms\n"):
        f = tmp_path / "m.py"
        f.write_text(src)
        assert not _backend_imports(f), src

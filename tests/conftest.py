"""Shared fixtures: ``rank_pool(world, engine)``, the one way tests get live ranks (kept across
the session: starting processes per test is too slow); the session's check that no
shared-memory file is left; ``debug_dir``/``trace_dir`` for the ranks' environment."""

from __future__ import annotations

import os
import shutil
import tempfile

import pytest

# Before tilecomm reads its settings: under pytest-xdist every worker keeps its segments in a
# directory of its own (shm_files.py), removed at the end of its session, or when the worker
# exits without one (atexit); one whose worker died unseen (its pid is in the name) is
# removed by the next session's workers.
if os.environ.get("PYTEST_XDIST_WORKER") and "TILECOMM_SHM_DIR" not in os.environ:
    import atexit

    import shm_files

    shm_files.remove_stale_worker_dirs()
    os.environ["TILECOMM_SHM_DIR"] = tempfile.mkdtemp(
        prefix=shm_files.worker_dir_prefix(os.environ["PYTEST_XDIST_WORKER"]), dir="/dev/shm")
    _OWN_SHM_DIR = os.environ["TILECOMM_SHM_DIR"]
    atexit.register(shutil.rmtree, _OWN_SHM_DIR, ignore_errors=True)
else:
    _OWN_SHM_DIR = None

# The GPU kernels in the Triton interpreter, imported once here: the ranks of the pools fork
# from this process and inherit them (importing triton costs a rank ~1.5 s of CPU). Tests that
# need Triton's compiler run it in a subprocess whose environment drops TRITON_INTERPRET.
os.environ["TRITON_INTERPRET"] = "1"
# auto resolves with the shipped costs, whatever `tilecomm tune` stored on this machine (tests
# of the tune file point TILECOMM_TUNE_DIR at their own directory)
os.environ.setdefault("TILECOMM_TUNE", "0")
import tilecomm.backends.triton  # noqa: E402,F401
import tilecomm.device.lang  # noqa: E402,F401

import rank_setup  # noqa: E402  (tests/ is on sys.path: rootdir conftest)
import shm_files  # noqa: E402
import tilecomm  # noqa: E402

# Small scratch so that modest test sizes already run in several pieces.
TEST_SCRATCH = 64 << 10
TEST_HEAP = 16 << 20
#: how long a pool's ranks wait for a peer: the interpreter runs kernels slowly
ENGINE_TIMEOUT = {"executor": 20, "interpreter": 60, "compat": 60, "kernels": 60}


class RankPool:
    """``world`` live ranks on one engine (``rank_setup.SETUP``), shared by every test of the
    session that asks for the same pair. ``run(fn, *args)`` runs ``fn(comm, *args)`` on every
    rank (then collects garbage there) and returns the ranks' results in rank order; a call that
    raised stops the group (its ranks may be out of step) and the next ``run`` starts anew."""

    def __init__(self, pools: "_Pools", world: int, engine: str):
        self.pools, self.world, self.engine = pools, world, engine

    @property
    def group(self) -> tilecomm.RankGroup:
        return self.pools.group(self.world, self.engine)

    def run(self, fn, *args):
        try:
            out = self.group.run(rank_setup.call, self.engine, fn, *args)
        except BaseException:
            self.discard()
            raise
        if any(blocks != out[0][1] for _, blocks in out):
            # One rank still holds heap blocks the others freed, or holds them elsewhere (a
            # test's cache, a call that failed on one side): the next alloc would diverge, so
            # the next run starts afresh.
            self.discard()
        return [res for res, _ in out]

    def run_and_discard(self, fn, *args):
        """``run``, then stop these ranks whatever happened: for a call that leaves them out of
        step on purpose (a peer that stays silent until a wait times out)."""
        try:
            return self.run(fn, *args)
        finally:
            self.discard()

    def discard(self) -> None:
        """Stop these ranks (e.g. after a test left their epochs out of step)."""
        self.pools.discard(self.world, self.engine)


class _Pools:
    def __init__(self):
        self.groups: dict[tuple[int, str], tilecomm.RankGroup] = {}

    def group(self, world: int, engine: str) -> tilecomm.RankGroup:
        key = (world, engine)
        g = self.groups.get(key)
        if g is None or not g.procs or not all(p.is_alive() for p in g.procs):
            if g is not None:
                g.stop()
            # lang reads TILECOMM_DEVICE_COMPAT when it is imported, and this process imported
            # it without: the compat engine's ranks start as fresh interpreters
            fresh = engine == "compat"
            g = tilecomm.RankGroup(world, timeout=ENGINE_TIMEOUT[engine], heap_bytes=TEST_HEAP,
                                   scratch_bytes=TEST_SCRATCH,
                                   start_method="spawn" if fresh else None,
                                   env={"TILECOMM_DEVICE_COMPAT": "1"} if fresh else None).start()
            self.groups[key] = g
            try:
                g.run(rank_setup.SETUP[engine])
            except BaseException:
                self.discard(world, engine)
                raise
        return g

    def discard(self, world: int, engine: str) -> None:
        g = self.groups.pop((world, engine), None)
        if g is not None:
            g.stop()

    def close(self):
        for key in list(self.groups):
            self.discard(*key)


#: files whose tests share session state that costs a launch: one xdist worker runs them all
#: (the simulated hosts' shared launches, tests/hosts/shared_launches.py: on two workers each
#: layout was launched twice, ~50 s of CPU)
SHARED_SCOPES = {"tests/hosts/shared-launches": ("tests/hosts/test_hosts.py",
                                                 "tests/hosts/test_kv_hosts.py",
                                                 "tests/hosts/test_moe_hosts.py",
                                                 "tests/hosts/test_elastic_hosts.py")}


def pytest_collection_modifyitems(config, items):
    """The slow tests first (a stable sort): with two workers a long one started last would
    run alone at the end."""
    items.sort(key=lambda item: item.get_closest_marker("slow") is None)


@pytest.hookimpl(optionalhook=True)      # a hook of pytest-xdist: absent without it
def pytest_xdist_make_scheduler(config, log):
    """``--dist loadfile`` (pyproject.toml): a file's tests stay on one worker (they share
    rank pools, which each worker starts for itself), and so do the files of SHARED_SCOPES."""
    if config.getvalue("dist") != "loadfile":
        return None
    from xdist.scheduler import LoadFileScheduling

    class SharedScopes(LoadFileScheduling):
        def _split_scope(self, nodeid: str) -> str:
            path = super()._split_scope(nodeid)
            return next((scope for scope, files in SHARED_SCOPES.items() if path in files),
                        path)

    return SharedScopes(config, log)


@pytest.fixture(scope="session")
def _pools():
    pools = _Pools()
    yield pools
    pools.close()


@pytest.fixture
def rank_pool(_pools):
    """``rank_pool(world, engine="executor")``: a RankPool of live ranks kept for the session
    (starting ranks, and importing triton on them, is slow). Engines: ``executor``,
    ``interpreter``, ``compat``, ``kernels`` (see tests/rank_setup.py)."""
    def get(world: int, engine: str = "executor") -> RankPool:
        if engine not in rank_setup.SETUP:
            raise ValueError(f"rank_pool: engine must be one of {sorted(rank_setup.SETUP)}, "
                             f"got {engine!r}")
        return RankPool(_pools, world, engine)
    return get


@pytest.fixture(autouse=True, scope="session")
def _no_leaks():
    before = shm_files.tilecomm_files()
    yield
    left = shm_files.tilecomm_files() - before
    if _OWN_SHM_DIR is not None:
        shutil.rmtree(_OWN_SHM_DIR, ignore_errors=True)
    assert not left, f"segment files left behind: {sorted(left)}"


@pytest.fixture
def debug_dir(tmp_path, monkeypatch):
    """TILECOMM_DEBUG_DIR for rank processes started by this test (fork inherits the env;
    the parent's settings cache must not hold the old value)."""
    from tilecomm.settings import settings

    d = tmp_path / "flight"
    monkeypatch.setenv("TILECOMM_DEBUG_DIR", str(d))
    settings.cache_clear()
    yield d
    settings.cache_clear()


@pytest.fixture
def trace_dir(tmp_path, monkeypatch):
    """TILECOMM_TRACE for rank processes started by this test (as ``debug_dir``)."""
    from tilecomm.settings import settings

    d = tmp_path / "trace"
    monkeypatch.setenv("TILECOMM_TRACE", str(d))
    settings.cache_clear()
    yield d
    settings.cache_clear()

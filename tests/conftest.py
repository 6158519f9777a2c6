"""Shared fixtures. ``ranks(world_size)`` returns a RankGroup that stays alive across tests
(starting processes per test is too slow); a group whose rank failed is restarted."""

from __future__ import annotations

import os

import pytest

import tilecomm

# Small scratch so that modest test sizes already run in several pieces.
TEST_SCRATCH = 64 << 10
TEST_HEAP = 16 << 20


class _Pools:
    def __init__(self):
        self.groups: dict[int, tilecomm.RankGroup] = {}

    def get(self, world_size: int) -> "PoolHandle":
        g = self.groups.get(world_size)
        if g is None or not g.procs or not all(p.is_alive() for p in g.procs):
            if g is not None:
                g.stop()
            g = tilecomm.RankGroup(world_size, timeout=20, heap_bytes=TEST_HEAP,
                                   scratch_bytes=TEST_SCRATCH).start()
            self.groups[world_size] = g
        return PoolHandle(self, world_size, g)

    def close(self):
        for g in self.groups.values():
            g.stop()
        self.groups.clear()


class PoolHandle:
    def __init__(self, pools, world_size, group):
        self.pools, self.world_size, self.group = pools, world_size, group

    def run(self, fn, *args):
        try:
            return self.group.run(fn, *args)
        except BaseException:
            self.pools.groups.pop(self.world_size, None)  # stopped by collect(); restart next time
            raise


@pytest.fixture(scope="session")
def _pools():
    pools = _Pools()
    yield pools
    pools.close()


@pytest.fixture
def ranks(_pools):
    """``ranks(w).run(fn, *args)`` runs ``fn(comm, *args)`` on w live ranks."""
    return _pools.get


@pytest.fixture(autouse=True, scope="session")
def _no_leaks():
    before = {f for f in os.listdir("/dev/shm") if f.startswith("tilecomm-")}
    yield
    after = {f for f in os.listdir("/dev/shm") if f.startswith("tilecomm-")}
    assert not (after - before), f"segment files left behind: {sorted(after - before)}"


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


@pytest.fixture(scope="module")
def kernel_group():
    """``kernel_group(w)``: a RankGroup of ``w`` ranks running kernels in the interpreter,
    kept for the module's tests (restarted if a rank died)."""
    groups: dict[int, tilecomm.RankGroup] = {}

    from kernel_setup import kernels_on, live_group     # tests/ is on sys.path (conftest)

    def start(w):
        g = tilecomm.RankGroup(w, timeout=60, heap_bytes=8 << 20, scratch_bytes=64 << 10).start()
        g.run(kernels_on)
        return g

    def get(w):
        return live_group(groups, w, start)

    yield get
    for g in groups.values():
        g.stop()

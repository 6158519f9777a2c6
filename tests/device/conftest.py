"""Device-API tests: kernels run under the Triton interpreter in forked rank processes.

The pytest process itself never imports ``tilecomm.device.lang`` (nor triton): TRITON_INTERPRET
must be set before triton decorates the kernels, so each rank sets it and imports the kernels
itself. ``device_ranks(w).run(fn, *args)`` runs ``fn(comm, *args)`` on a session pool of w
ranks prepared that way (separate from the root ``ranks`` pools, whose processes stay free of
triton).
"""

from __future__ import annotations

import pytest

import tilecomm

from .helpers import _interpret, call

class _DevicePools:
    def __init__(self):
        self.groups: dict[int, tilecomm.RankGroup] = {}

    def get(self, world_size):
        g = self.groups.get(world_size)
        if g is None or not g.procs or not all(p.is_alive() for p in g.procs):
            if g is not None:
                g.stop()
            g = tilecomm.RankGroup(world_size, timeout=30, heap_bytes=4 << 20,
                                   scratch_bytes=64 << 10).start()
            g.run(_interpret)
            self.groups[world_size] = g
        return _Handle(self, world_size, g)

    def close(self):
        for g in self.groups.values():
            g.stop()
        self.groups.clear()


class _Handle:
    def __init__(self, pools, world_size, group):
        self.pools, self.world_size, self.group = pools, world_size, group

    def run(self, fn, *args):
        try:
            return self.group.run(call, fn, *args)
        except BaseException:
            self.pools.groups.pop(self.world_size, None)
            raise


@pytest.fixture(scope="session")
def _device_pools():
    pools = _DevicePools()
    yield pools
    pools.close()


@pytest.fixture
def device_ranks(_device_pools):
    return _device_pools.get

"""The fixture for tests on simulated hosts (``tilecomm.simhosts``): each host is torchrun in
its own mount and UTS namespaces with a private /dev/shm. Skips, with the reason, where this
machine does not allow namespaces."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tilecomm import simhosts

HERE = Path(__file__).resolve().parent


def _shm_files() -> set[str]:
    return {f for f in os.listdir("/dev/shm") if f.startswith("tilecomm")}


@pytest.fixture
def run_on_hosts():
    """``run_on_hosts(per_host, script, *args, timeout=...)`` -> output of every host; fails
    the test with the output when a host exits non-zero, and checks that nothing of tilecomm
    is left in this machine's /dev/shm."""
    reason = simhosts.available()
    if reason:
        pytest.skip(f"simulated hosts unavailable here: {reason}")
    before = _shm_files()

    def run(per_host, script, *args, timeout=240):
        path = script if os.path.isabs(str(script)) else HERE / script
        res = simhosts.run(list(per_host), [str(path), *map(str, args)], timeout=timeout,
                           capture=True)
        assert not res.timed_out, f"timed out after {timeout} s\n{res.output[-4000:]}"
        assert res.ok, res.output[-6000:]
        return res.output

    yield run
    assert _shm_files() <= before, f"left in /dev/shm: {sorted(_shm_files() - before)}"

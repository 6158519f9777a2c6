"""Fixtures for tests on simulated hosts (``tilecomm.simhosts``): each host is torchrun in its
own mount and UTS namespaces with a private /dev/shm. ``shared_hosts`` gives the output of the
one launch per layout that every scenario leaving the ranks alive shares (shared_launches.py);
``run_on_hosts`` starts a launch of its own. Both skip, with the reason, where this machine
does not allow namespaces, and check that nothing of tilecomm is left in its /dev/shm."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

import shared_launches
from shm_files import tilecomm_files
from tilecomm import simhosts

HERE = Path(__file__).resolve().parent


@pytest.fixture(autouse=True)
def _hosts_use_their_own_shm(monkeypatch):
    """Hosts get this process's environment, without this worker's segment directory
    (tests/shm_files.py), which a host's private /dev/shm does not have: for the launches
    here and for those tilecomm's CLI and helpers start."""
    from tilecomm.settings import settings

    monkeypatch.delenv("TILECOMM_SHM_DIR", raising=False)
    settings.cache_clear()
    yield
    settings.cache_clear()


def _run(per_host, script, *args, timeout=240):
    path = script if os.path.isabs(str(script)) else HERE / script
    res = simhosts.run(list(per_host), [str(path), *map(str, args)], timeout=timeout,
                       capture=True)
    assert not res.timed_out, f"timed out after {timeout} s\n{res.output[-4000:]}"
    assert res.ok, res.output[-6000:]
    return res.output


@pytest.fixture(scope="session")
def shared_hosts(tmp_path_factory):
    """``shared_hosts(per_host)`` -> ``(output, out_dir)`` of the one launch of that layout
    (shared_launches.py), started by the first test that asks for it; a launch that failed
    fails every test that reads it, with its output."""
    reason = simhosts.available()
    if reason:
        pytest.skip(f"simulated hosts unavailable here: {reason}")
    done: dict[tuple, tuple] = {}

    def get(per_host):
        per_host = tuple(per_host)
        if per_host not in done:
            out_dir = tmp_path_factory.mktemp("hosts-" + "-".join(map(str, per_host)))
            before = tilecomm_files("/dev/shm")
            try:
                out = _run(per_host, "hosts_api.py",
                           *shared_launches.scenarios(per_host, str(out_dir)), timeout=300)
                left = tilecomm_files("/dev/shm") - before
                done[per_host] = (None if not left else f"left in /dev/shm: {sorted(left)}",
                                  out, out_dir)
            except AssertionError as e:
                done[per_host] = (f"the shared launch of {per_host} failed:\n{e}", "", out_dir)
        err, out, out_dir = done[per_host]
        if err:
            pytest.fail(err)
        return out, out_dir

    return get


@pytest.fixture
def run_on_hosts():
    """``run_on_hosts(per_host, script, *args, timeout=...)`` -> output of every host; fails
    the test with the output when a host exits non-zero, and checks that nothing of tilecomm
    is left in this machine's /dev/shm."""
    reason = simhosts.available()
    if reason:
        pytest.skip(f"simulated hosts unavailable here: {reason}")
    before = tilecomm_files("/dev/shm")

    yield _run
    left = tilecomm_files("/dev/shm") - before
    assert not left, f"left in /dev/shm: {sorted(left)}"

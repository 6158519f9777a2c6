"""Killing the launcher ends its ranks (issue 12, gaps 1 and 3).

The launcher (tests/runtime/launcher_program.py) runs 3 ranks that never return: rank 0 computes
in a Python loop, ranks 1 and 2 wait for it in an all_reduce. Before the fix, SIGTERM, SIGHUP
and SIGKILL of the launcher left the ranks running with PPID 1, and SIGINT took 6.3 s (a 2 s
join per rank in turn). The bounds below are generous limits on a loaded 2-core machine, not
speed claims: the ranks notice within ``tilecomm.orphan.POLL`` (0.1 s).
"""

from __future__ import annotations

import os
import queue
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

PROGRAM = Path(__file__).with_name("launcher_program.py")
WORLD = 3


def _alive(pid: int) -> bool:
    """Running (a zombie waiting for a reaper counts as ended)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            state = f.read().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return False
    return state not in ("Z", "X")


def _wait_gone(pids, bound: float) -> list[int]:
    """Poll until every pid has ended or ``bound`` seconds passed; the ones still running."""
    deadline = time.monotonic() + bound
    while time.monotonic() < deadline:
        left = [p for p in pids if _alive(p)]
        if not left:
            return []
        time.sleep(0.02)
    return [p for p in pids if _alive(p)]


class _Launcher:
    """The launcher program as a subprocess, with its ranks' pids once they all run."""

    def __init__(self, tmp_path: Path):
        self.shm = tmp_path / "shm"
        self.shm.mkdir()
        env = dict(os.environ, TILECOMM_SHM_DIR=str(self.shm), TILECOMM_TIMEOUT="120")
        # its own session: the cleanup can end the launcher's whole process group
        self.proc = subprocess.Popen([sys.executable, str(PROGRAM), str(WORLD)], env=env,
                                     stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                     text=True, start_new_session=True)
        self.lines: queue.Queue = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()
        self.ranks: dict[int, int] = {}
        self.output: list[str] = []
        try:
            self._wait_for_ranks()
        except BaseException:
            self.kill_all()
            raise

    def _wait_for_ranks(self):
        deadline = time.monotonic() + 60
        while len(self.ranks) < WORLD:
            try:
                line = self.lines.get(timeout=max(0.1, deadline - time.monotonic()))
            except queue.Empty:
                break
            self.output.append(line)
            if line.startswith("RANK "):
                _, r, pid = line.split()
                self.ranks[int(r)] = int(pid)
        if len(self.ranks) < WORLD:
            pytest.fail("the ranks did not start:\n" + "".join(self.output))
        time.sleep(0.3)          # rank 0 is in its loop, the others inside all_reduce

    def _read(self):
        for line in self.proc.stdout:
            self.lines.put(line)

    def kill_all(self):
        """End the launcher's process group and every rank seen (ranks outlive the group's
        leader only when the test failed)."""
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        for pid in self.ranks.values():
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        self.proc.wait(timeout=10)


@pytest.fixture
def launcher(tmp_path):
    launched = []

    def start():
        launched.append(_Launcher(tmp_path))
        return launched[-1]

    yield start
    for ln in launched:
        ln.kill_all()        # a no-op when the test passed


@pytest.mark.slow
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL, signal.SIGHUP])
def test_ranks_end_with_a_killed_launcher(launcher, sig):
    ln = launcher()
    assert all(_alive(p) for p in ln.ranks.values())
    os.kill(ln.proc.pid, sig)
    ln.proc.wait(timeout=10)
    left = _wait_gone(list(ln.ranks.values()), bound=3.0)
    assert not left, f"ranks {left} outlived a launcher killed by {sig.name}"
    assert not os.listdir(ln.shm), "segment files left behind"


@pytest.mark.slow
def test_sigint_to_the_launcher_stops_busy_ranks_together(launcher):
    ln = launcher()
    t0 = time.monotonic()
    os.kill(ln.proc.pid, signal.SIGINT)
    ln.proc.wait(timeout=20)
    took = time.monotonic() - t0
    assert not _wait_gone(list(ln.ranks.values()), bound=3.0)
    # one 2 s grace for all ranks, then a kill: well under the old 3 x 2 s
    assert took < 4.5, f"stopping {WORLD} busy ranks took {took:.1f} s"
    assert not os.listdir(ln.shm)


def _busy(comm):
    while True:
        pass


def test_stop_gives_all_ranks_one_shared_grace():
    """RankGroup.stop asks all ranks at once and waits on one deadline: with grace 1 s, three
    ranks that never read the request are killed after that one grace (not 3 s, one per rank)."""
    import tilecomm

    g = tilecomm.RankGroup(WORLD, timeout=30).start()
    for c in g.conns:
        c.send((_busy, ()))
    procs = list(g.procs)
    t0 = time.monotonic()
    g.stop(grace=1.0)
    took = time.monotonic() - t0
    assert all(p.exitcode == -signal.SIGKILL for p in procs)
    assert took < 2.5, f"stop took {took:.2f} s for {WORLD} busy ranks"

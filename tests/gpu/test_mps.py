"""tilecomm.mps against a fake nvidia-cuda-mps-control (fake_mps_control.py): the daemon is
started with private pipe and log directories, every rank gets them and its share of the GPU,
and ``quit`` is sent on every way out (success, exception, signal); a running daemon is used
and left alone; a daemon that cannot start is reported, never fatal. Ranks that share a GPU
also leave cleanly: SIGTERM unwinds them instead of killing them."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import textwrap
import time

import pytest

import tilecomm
from tilecomm.mps import MpsDaemon, ranks_per_device, thread_percentage

pytestmark = pytest.mark.gpu

FAKE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fake_mps_control.py")


@pytest.fixture
def fake(tmp_path, monkeypatch):
    """The fake control program, its call log, and no daemon answering anywhere else."""
    log = tmp_path / "calls.jsonl"
    monkeypatch.setenv("FAKE_MPS_LOG", str(log))
    monkeypatch.setenv("CUDA_MPS_PIPE_DIRECTORY", str(tmp_path / "nobody-here"))
    monkeypatch.delenv("CUDA_MPS_LOG_DIRECTORY", raising=False)

    def calls():
        if not log.exists():
            return []
        return [json.loads(x) for x in log.read_text().splitlines()]
    return FAKE, calls


def _quits(calls):
    return [c for c in calls() if "quit" in c.get("commands", [])]


def _rank_env(comm):
    return {k: os.environ.get(k) for k in ("CUDA_MPS_PIPE_DIRECTORY", "CUDA_MPS_LOG_DIRECTORY",
                                          "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE")}


def test_started_with_private_dirs_ranks_get_them_and_quit_at_the_end(fake):
    prog, calls = fake
    with MpsDaemon(4, control=prog) as mps:
        s = mps.state
        assert s.status == "started" and s.percentage == 25, s
        assert os.path.basename(os.path.dirname(s.pipe_dir)).startswith("tilecomm-mps-")
        assert os.path.exists(os.path.join(s.pipe_dir, "control"))
        start = [c for c in calls() if c["argv"] == ["-d"]]
        assert len(start) == 1 and start[0]["pipe"] == s.pipe_dir and start[0]["log"] == s.log_dir
        group = tilecomm.RankGroup(2, timeout=20, env=mps.rank_env()).start()
        try:
            envs = group.run(_rank_env)
        finally:
            group.stop()
        assert envs == [{"CUDA_MPS_PIPE_DIRECTORY": s.pipe_dir,
                         "CUDA_MPS_LOG_DIRECTORY": s.log_dir,
                         "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "25"}] * 2
        tmp = os.path.dirname(s.pipe_dir)
    assert len(_quits(calls)) == 1 and _quits(calls)[0]["pipe"] == s.pipe_dir
    assert not os.path.exists(tmp)                  # the private directories are gone
    assert not mps._answers(s.pipe_dir)


def test_quit_is_sent_when_the_block_raises(fake):
    prog, calls = fake
    with pytest.raises(RuntimeError, match="boom"):
        with MpsDaemon(2, control=prog) as mps:
            assert mps.state.status == "started"
            raise RuntimeError("boom")
    assert len(_quits(calls)) == 1
    assert mps.stop() is True and len(_quits(calls)) == 1     # a second stop sends nothing


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_quit_is_sent_when_the_process_is_signalled(fake, tmp_path, sig):
    prog, calls = fake
    code = textwrap.dedent(f"""
        import sys, time
        from tilecomm.mps import MpsDaemon
        mps = MpsDaemon(2, control={prog!r})
        mps.start()
        print(mps.state.status, flush=True)
        time.sleep(60)
        """)
    p = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    assert p.stdout.readline().strip() == "started"
    p.send_signal(sig)
    p.wait(timeout=30)
    assert p.returncode != 0                        # the signal still ends the process
    assert len(_quits(calls)) == 1


@pytest.mark.slow
def test_quit_is_sent_at_interpreter_exit(fake):
    prog, calls = fake
    code = f"from tilecomm.mps import MpsDaemon\nMpsDaemon(2, control={prog!r}).start()\n"
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)
    assert len(_quits(calls)) == 1


def test_a_running_daemon_is_used_and_left_alone(fake, tmp_path, monkeypatch):
    prog, calls = fake
    theirs = tmp_path / "theirs"
    theirs.mkdir()
    env = dict(os.environ, CUDA_MPS_PIPE_DIRECTORY=str(theirs))
    subprocess.run([prog, "-d"], env=env, check=True, timeout=10)
    try:
        for _ in range(100):
            if (theirs / "control").exists():
                break
            time.sleep(0.05)
        monkeypatch.setenv("CUDA_MPS_PIPE_DIRECTORY", str(theirs))
        with MpsDaemon(2, control=prog) as mps:
            assert mps.state.status == "running" and mps.state.pipe_dir == str(theirs)
            assert mps.rank_env()["CUDA_MPS_PIPE_DIRECTORY"] == str(theirs)
        assert not _quits(calls) and (theirs / "control").exists()
        assert len([c for c in calls() if c["argv"] == ["-d"]]) == 1     # ours only
    finally:
        subprocess.run([prog], input="quit\n", text=True, env=env, timeout=10)


def test_a_daemon_that_cannot_start_is_reported_and_the_ranks_run_without(fake, monkeypatch):
    prog, calls = fake
    monkeypatch.setenv("FAKE_MPS_FAIL", "1")
    with MpsDaemon(2, control=prog) as mps:
        assert mps.state.status == "unavailable" and "exited with 1" in mps.state.reason
        assert any("cannot start" in d for d in mps.state.detail), mps.state.detail
        assert mps.rank_env() == {}
    assert not _quits(calls)


def test_nothing_is_started_on_a_prohibited_gpu_or_without_the_program(fake):
    prog, calls = fake
    s = MpsDaemon(2, control=prog, compute_modes=["Prohibited"]).start()
    assert s.status == "unavailable" and "Prohibited" in s.reason
    s = MpsDaemon(2, control="no-such-mps-control").start()
    assert s.status == "unavailable" and "not found" in s.reason
    assert calls() == []


def test_shares_sum_to_at_most_a_whole_gpu():
    for n in range(1, 17):
        assert 1 <= thread_percentage(n) and n * thread_percentage(n) <= 100
    assert ranks_per_device(4, 1) == 4 and ranks_per_device(4, 2) == 2
    assert ranks_per_device(3, 2) == 2 and ranks_per_device(4, 8, "cuda:0") == 4


def _stuck(comm, marker):
    if comm.rank == 1:
        try:
            time.sleep(60)
        finally:                       # runs only if the rank unwinds
            with open(marker, "w") as f:
                f.write("unwound")
    return comm.rank


def test_ranks_leave_cleanly_when_stopped(tmp_path):
    """With leave_grace, stop() unwinds a rank that does not answer (SIGTERM, its finally
    blocks and queued GPU work finish) before it would kill it."""
    marker = tmp_path / "unwound"
    g = tilecomm.RankGroup(2, timeout=20, leave_grace=10).start(first_task=(_stuck, (marker,)))
    time.sleep(1.0)
    procs = list(g.procs)
    t0 = time.monotonic()
    g.stop(grace=0.2)
    assert time.monotonic() - t0 < 8
    assert marker.read_text() == "unwound"
    assert procs[1].exitcode == 128 + signal.SIGTERM, procs[1].exitcode


def test_launch_with_mps_gives_the_ranks_their_share_and_quits(fake, monkeypatch):
    prog, calls = fake
    from tilecomm.settings import settings
    monkeypatch.setenv("TILECOMM_MPS_CONTROL", prog)
    settings.cache_clear()
    try:
        envs = tilecomm.launch(_rank_env, 2, timeout=20, mps=True)
    finally:
        settings.cache_clear()
    assert envs[0] == envs[1] and envs[0]["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "50"
    assert envs[0]["CUDA_MPS_PIPE_DIRECTORY"].startswith(tempfile.gettempdir())
    assert len(_quits(calls)) == 1

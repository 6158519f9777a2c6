"""`tilecomm trace analyze DIR --json` on real multi-rank failures: it names the rank at
fault, the collective and its sequence number, also when that rank left no dump."""

from __future__ import annotations

import json
import os
import signal

import pytest
import torch

import tilecomm
from tilecomm.cli import main


def _job(comm, case):
    """Ranks 0 and 2 call all_reduce #1, all_reduce #2, barrier #3; rank 1 goes wrong at #2."""
    t = torch.ones(8)
    comm.all_reduce(t)
    if comm.rank == 1:
        if case == "skip":
            return "returned early"
        if case == "other":
            comm.broadcast(t)
        if case == "reject":
            comm.all_reduce(t, "xor")
        if case == "kill":
            os.kill(os.getpid(), signal.SIGKILL)
        if case == "stop":
            os.kill(os.getpid(), signal.SIGSTOP)
    comm.all_reduce(t)
    comm.barrier()


def _analyze(d, capsys) -> dict:
    capsys.readouterr()
    assert main(["trace", "analyze", str(d), "--json"]) == 0
    return json.loads(capsys.readouterr().out)


@pytest.mark.parametrize("case, fault, dumps", [
    ("skip", "never arrived", [0, 1, 2]),     # rank 1 answers the launcher's SIGUSR1
    ("other", "arrived at another collective", [0, 1, 2]),
    ("reject", "rejected its call", [0, 1, 2]),
    ("kill", "died", [0, 2]),
    ("stop", "stalled", [0, 2]),              # a stopped process cannot dump
])
@pytest.mark.slow
def test_analyze_names_the_rank_at_fault(debug_dir, capsys, case, fault, dumps):
    with pytest.raises(tilecomm.RankError):
        # 1.5 s: rank 1 never arrives in "skip" and "stop"; the others time out
        tilecomm.launch(_job, 3, case, timeout=1.5, heap_bytes=1 << 20,
                        scratch_bytes=64 << 10) if case != "skip" else _persistent(_job, case)
    assert sorted(int(f[len("flight-rank"):-5]) for f in os.listdir(debug_dir)) == dumps
    res = _analyze(debug_dir, capsys)
    assert res["culprits"] == [1], res
    assert (res["op"], res["seq"]) == ("all_reduce", 2), res
    assert res["faults"] == {"1": fault}, res
    assert "all_reduce #2" in res["explanation"] and "rank 1" in res["explanation"]
    if case in ("skip", "kill", "stop"):     # the others say whom they waited for
        for r in (0, 2):
            assert res["waiting"][str(r)].startswith("waited for rank 1 "), res
    assert res["missing_dumps"] == sorted({0, 1, 2} - set(dumps))


def _persistent(fn, case):
    """Rank 1 returns early but stays alive (a RankGroup keeps its ranks), so it is the
    launcher stopping the group that makes it dump."""
    with tilecomm.RankGroup(3, timeout=1.5, heap_bytes=1 << 20,
                            scratch_bytes=64 << 10) as g:
        g.run(fn, case)


def test_text_report_says_who_and_where(debug_dir, capsys):
    with pytest.raises(tilecomm.RankError):
        tilecomm.launch(_job, 3, "kill", timeout=1.5, heap_bytes=1 << 20,
                        scratch_bytes=64 << 10)
    capsys.readouterr()
    assert main(["trace", "analyze", str(debug_dir)]) == 0
    out = capsys.readouterr().out
    assert out.splitlines()[0] == "at fault: rank(s) [1] at all_reduce #2 (rank 1: died)"
    assert "rank 1: no dump" in out


def test_analyze_without_dumps_is_a_clear_error(tmp_path, capsys):
    assert main(["trace", "analyze", str(tmp_path)]) == 2
    assert "no flight-rank*.json files" in capsys.readouterr().err

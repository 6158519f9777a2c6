"""`tilecomm trace analyze DIR --json` on real multi-rank failures: it names the rank at
fault, the collective and its sequence number, also when that rank left no dump."""

from __future__ import annotations

import json
import os
import re
import signal
import threading
import time

import pytest
import torch

import tilecomm
from tilecomm.cli import main
from tilecomm.debug.analyze import analyze
from tilecomm.debug.flight import FORMAT


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
    ("kill", "exited", [0, 2]),               # killed between calls: as a clean exit looks
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
    assert out.splitlines()[0] == "at fault: rank(s) [1] at all_reduce #2 (rank 1: exited)"
    assert "rank 1: no dump" in out


def test_analyze_without_dumps_is_a_clear_error(tmp_path, capsys):
    assert main(["trace", "analyze", str(tmp_path)]) == 2
    assert "no flight-rank*.json files" in capsys.readouterr().err


# ---- verdicts that were wrong: a clean exit, a rank busy in its own code, hosts, quoting --------
def _launch_fails(fn, world, *args, timeout=1.0):
    with pytest.raises(tilecomm.RankError):
        tilecomm.launch(fn, world, *args, timeout=timeout, heap_bytes=1 << 20,
                        scratch_bytes=64 << 10)


def _returns_early(comm):
    comm.all_reduce(torch.ones(8))
    if comm.rank == 1:
        return "done"             # the function returns: the process exits with code 0
    comm.all_reduce(torch.ones(8))


def test_a_rank_that_returned_and_exited_is_not_called_dead(debug_dir):
    _launch_fails(_returns_early, 2)
    assert sorted(os.listdir(debug_dir)) == ["flight-rank0.json"]
    res = analyze(str(debug_dir))
    assert res["culprits"] == [1] and (res["op"], res["seq"]) == ("all_reduce", 2), res
    # nothing in the dumps tells a clean exit from a kill between calls: no claim of a crash
    assert res["faults"] == {"1": "exited"}, res
    text = res["explanation"]
    assert "died" not in text and "crash" not in text, text
    assert "rank 1 never arrived at #2" in text and "cleanly or not" in text, text
    assert "after its last call all_reduce #1" in text, text


def _killed_inside_a_call(comm):
    comm.all_reduce(torch.ones(8))
    if comm.rank == 1:            # killed while it waits in all_reduce #2 for rank 0
        threading.Timer(0.3, os.kill, (os.getpid(), signal.SIGKILL)).start()
    else:
        time.sleep(0.6)
    # 256 KiB through 64 KiB of scratch: several pieces, so rank 0 needs rank 1 again after it
    # arrives (with one piece it could finish on what rank 1 had posted before it died)
    comm.all_reduce(torch.ones(1 << 16))


def test_a_rank_killed_inside_a_call_died_there(debug_dir):
    _launch_fails(_killed_inside_a_call, 2)
    res = analyze(str(debug_dir))
    assert res["culprits"] == [1] and res["faults"] == {"1": "died"}, res
    assert "rank 1 died inside all_reduce #2" in res["explanation"], res


def _sleeps(comm, seconds):
    comm.all_reduce(torch.ones(8))
    if comm.rank == 1:
        time.sleep(seconds)       # the program's own code, in Python
    comm.all_reduce(torch.ones(8))


@pytest.mark.slow
def test_a_rank_sleeping_in_python_is_busy_in_its_own_code_not_hung(debug_dir):
    # 5 s: still asleep when the launcher stops the job (rank 0 gives up at 0.5 s, the
    # launcher waits 2 s more, then kills what is left) and asks for dumps (SIGUSR1 interrupts
    # time.sleep and runs the handler)
    _launch_fails(_sleeps, 2, 5.0, timeout=0.5)
    assert sorted(os.listdir(debug_dir)) == ["flight-rank0.json", "flight-rank1.json"]
    res = analyze(str(debug_dir))
    assert res["culprits"] == [1] and res["faults"] == {"1": "never arrived"}, res
    text = res["explanation"]
    assert "hung" not in text and "stalled" not in text, text
    assert re.search(r"rank 1 never arrived at #2: .*outside tilecomm, in the program's own "
                     r"code.* after its last call all_reduce #1 \(.*\) completed", text), text


@pytest.mark.slow
def test_a_rank_back_from_its_own_code_after_the_timeout_arrived_late(debug_dir):
    # rank 0 gives up after 0.5 s; rank 1 comes back at 1 s and finds it gone
    _launch_fails(_sleeps, 2, 1.0, timeout=0.5)
    res = analyze(str(debug_dir))
    assert res["culprits"] == [1] and res["faults"] == {"1": "arrived late"}, res
    assert re.search(r"rank 1 arrived at #2 \d+\.\d s after rank 0 had given up waiting for it: "
                     r"it had been outside tilecomm, in the program's own code, for \d+\.\d s",
                     res["explanation"]), res


# Hand-built dumps in the flight format (flight.py: dump_all's document, Record.to_json)
T0 = 1_700_000_000_000_000_000


def _rec(seq, state="completed", at=(0.0, 0.03), wait=None, error=None, op="all_reduce",
         algorithm="hier_leader", nbytes=16):
    return {"seq": seq, "op": op, "algorithm": algorithm, "bytes": nbytes, "dtype": "float32",
            "root": None, "peers": None, "state": state, "issued_ns": T0 + int(at[0] * 1e9),
            "ended_ns": None if at[1] is None else T0 + int(at[1] * 1e9),
            "wait": None if wait is None else {"ranks": wait[0], "phase": wait[1],
                                               "since_ns": T0},
            "error": error, "device": None, "note": None, "group": 1}


def _write_dumps(d, world, records, written=3.1, reason=None):
    """One dump per rank in ``records`` (rank -> its records of communicator 1), as written by
    a failed call (the reason; or ``reason``)."""
    os.makedirs(d, exist_ok=True)
    for rank, recs in records.items():
        last = recs[-1]
        doc = {"format": FORMAT, "host": f"host{rank // 2}", "pid": 1000 + rank, "rank": rank,
               "world_size": world, "written_ns": T0 + int(written * 1e9),
               "reason": reason or f"{last['error'].split(':')[0]} in {last['op']} "
                                   f"#{last['seq']}",
               "comms": [{"id": 1, "rank": rank, "world_size": world,
                          "ranks": list(range(world)), "capacity": 2000, "next_seq": 3,
                          "created_ns": T0, "records": recs}]}
        with open(os.path.join(d, f"flight-rank{rank}.json"), "w") as f:
            json.dump(doc, f)
    return str(d)


HOST0 = "(local 0 = rank 0, local 1 = rank 1)"
HOST1 = "(local 0 = rank 2, local 1 = rank 3)"
IN_HOST, ALL = "inside the host", "every rank to arrive"      # a host step's wait phase


def test_hosts_a_leader_that_was_itself_waiting_is_not_blamed(tmp_path):
    """Two hosts of two ranks (as tests/hosts run them), timeout 3 s: rank 1 is 12 s late at
    all_reduce #2. Rank 0 waits for it inside host 0 and gives up; rank 2, host 1's leader,
    waits for rank 0 on the rail and times out; rank 3 waits for rank 2 inside host 1. Rank 2
    was named by rank 3's wait, but it was waiting itself: only rank 1 is at fault."""
    d = _write_dumps(tmp_path / "flight", 4, {
        0: [_rec(1), _rec(2, "failed", (0.03, 3.03), ([1], f"{IN_HOST}, reduce #4: {ALL}"),
                 f"CommTimeout: all_reduce #2: the step inside host 0 failed {HOST0}: reduce #4 "
                 f"on rank 0: no progress from rank(s) [1] in 3.0 s (the timeout is 3 s) while "
                 f"waiting for every rank to arrive. rank 1 is in no tilecomm call; its last "
                 f"was broadcast #3 (step 6).")],
        1: [_rec(1), _rec(2, "failed", (12.03, 12.04), None,
                 f"CommError: all_reduce #2: the step inside host 0 failed {HOST0}: reduce #4 on "
                 f"rank 1: rank 0 gave up on collective #4 after an error (a timeout or a "
                 f"mismatch; see rank 0's error); its communicator is unusable, so this one is "
                 f"too")],
        2: [_rec(1), _rec(2, "failed", (0.03, 3.03), None,
                 "CommTimeout: all_reduce #2: the inter-host exchange with rank(s) [0] failed "
                 "(peer died, stopped or timed out after 3 s): [gloo/transport/tcp/unbound_buf"
                 "fer.cc:129] Timed out waiting 3000ms for send operation to complete")],
        3: [_rec(1), _rec(2, "failed", (0.03, 3.03), ([2], f"{IN_HOST}, broadcast #5: {ALL}"),
                 f"CommTimeout: all_reduce #2: the step inside host 1 failed {HOST1}: broadcast "
                 f"#5 on rank 1: no progress from rank(s) [0] in 3.0 s (the timeout is 3 s) "
                 f"while waiting for every rank to arrive. rank 0 is in no tilecomm call; its "
                 f"last was reduce #4 (step 8).")],
    }, written=12.05)
    res = analyze(d)
    assert res["culprits"] == [1] and res["faults"] == {"1": "arrived late"}, res
    assert "rank 2 " in res["explanation"] and "2" in res["waiting"], res


def test_hosts_a_rank_seen_exiting_inside_its_host_is_named_by_its_global_number(tmp_path):
    """Rank 2 (host 1's leader) exits; rank 3 sees it go inside host 1, where rank 2 is local
    rank 0: the error's "rank(s) [0] exited" is rank 2, not the innocent rank 0."""
    gloo = ("[gloo/transport/tcp/pair.cc:537] Read error [127.0.0.1]:27566: Connection reset "
            "by peer.")
    d = _write_dumps(tmp_path / "flight", 4, {
        0: [_rec(1), _rec(2, "failed", (0.03, 0.3), None,
                 f"CommTimeout: all_reduce #2: the inter-host exchange with rank(s) [2] failed "
                 f"(peer died, stopped or timed out after 3 s): {gloo}")],
        1: [_rec(1), _rec(2, "failed", (0.03, 0.3), None,
                 f"CommTimeout: all_reduce #2: the step inside host 0 failed {HOST0}: broadcast "
                 f"#5: rank 0 gave up: all_reduce: CommTimeout: all_reduce #2: the inter-host "
                 f"exchange with rank(s) [2] failed (peer died, stopped or timed out after 3 s): "
                 f"{gloo} (missing ranks [2])")],
        3: [_rec(1), _rec(2, "failed", (0.03, 0.25), ([2], f"{IN_HOST}, reduce #4: {ALL}"),
                 f"CommTimeout: all_reduce #2: the step inside host 1 failed {HOST1}: reduce #4 "
                 f"on rank 1: rank(s) [0] exited while waiting for every rank to arrive. rank 0 "
                 f"is in no tilecomm call; its last was broadcast #3 (step 6).")],
    })
    res = analyze(d)
    assert res["culprits"] == [2] and res["faults"] == {"2": "exited"}, res
    assert "rank 2 exited" in res["explanation"], res


def _stalled_inside_all_reduce(tmp_path):
    """Rank 1 stopped inside all_reduce #2 (no dump); rank 0 timed out waiting for it."""
    return _write_dumps(tmp_path / "flight", 2, {
        0: [_rec(1, algorithm="one_shot", nbytes=32),
            _rec(2, "failed", (0.03, 1.03), ([1], "rank 1's data"),
                 "CommTimeout: all_reduce #2 on rank 0: no progress from rank(s) [1] in 1.0 s "
                 "(the timeout is 1 s) while waiting for rank 1's data. rank 1 is in "
                 "all_reduce #2 (step 7).", algorithm="one_shot", nbytes=32)]})


def test_quoted_errors_carry_no_internal_step_numbers(tmp_path):
    res = analyze(_stalled_inside_all_reduce(tmp_path))
    assert res["culprits"] == [1] and res["faults"] == {"1": "stalled"}, res
    assert "the waiters saw it in all_reduce #2" in res["explanation"], res
    everything = json.dumps(res)
    assert "step 7" not in everything and "(step" not in everything, everything
    assert res["ranks"]["0"].endswith("rank 1 is in all_reduce #2."), res


def test_a_transport_error_is_quoted_whole_or_cut_at_a_word():
    from tilecomm.hier.rails import first_line

    gloo = ("[/__w/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:537] Read error "
            "[127.0.0.1]:20098: Connection reset by peer. This is typically caused by a remote "
            "worker hanging or bugs in the application code.")
    assert first_line(gloo + "\nException raised from ...") == gloo     # was cut at 200
    long = "word " * 100
    cut = first_line(long, limit=42)
    assert cut == "word " * 7 + "word …", cut       # ends at the last whole word, marked



def _shrinks_past_a_dead_rank(comm):
    """Rank 2 is killed; ranks 0 and 1 shrink past it and go on; then they dump."""
    t = torch.ones(8)
    comm.all_reduce(t)
    if comm.rank == 2:
        os.kill(os.getpid(), signal.SIGKILL)
    try:
        comm.all_reduce(t)
    except tilecomm.CommTimeout:
        pass
    new = comm.shrink([2])
    for _ in range(3):
        new.all_reduce(t)
    comm.dump_flight()
    new.close()
    comm.close()


def test_a_run_that_shrank_says_who_was_lost_and_how_it_went_on(debug_dir):
    tilecomm.launch(_shrinks_past_a_dead_rank, 3, timeout=5, keep_going=True)
    res = analyze(str(debug_dir))
    assert res["culprits"] == [2] and (res["op"], res["seq"]) == ("all_reduce", 2), res
    assert res["recovery"] == ["ranks 0, 1 called shrink on communicator 0 (excluded [2])",
                               "communicator 1 (2 ranks) completed every call it recorded"]
    assert "The job went on: ranks 0, 1 called shrink on communicator 0" in \
        res["explanation"]


def test_ranks_told_to_stop_while_waiting_point_at_the_rank_that_failed(tmp_path):
    # under torchrun: rank 2 crashed, torchrun stopped ranks 0 and 1 (SIGTERM) mid-wait, and
    # they wrote their records on the way out (flight.dump_on_sigterm)
    d = _write_dumps(tmp_path / "flight", 3, {
        r: [_rec(1), _rec(2, "waiting", (0.03, None), ([2], "every rank to arrive"))]
        for r in (0, 1)},
        reason="SIGTERM: told to stop (torchrun stops the ranks when one fails)")
    res = analyze(d)
    assert res["culprits"] == [2] and res["faults"]["2"] == "failed", res
    assert "torchrun does that as soon as one rank fails" in res["explanation"]


def test_under_torchrun_the_ranks_told_to_stop_leave_their_records(tmp_path):
    """torchrun stops every rank (SIGTERM) once one fails, before the others notice: each
    writes its flight record on the way out (flight.dump_on_sigterm)."""
    import subprocess
    import sys

    d = tmp_path / "flight"
    script = os.path.join(os.path.dirname(__file__), "torchrun_crash.py")
    env = dict(os.environ, TILECOMM_DEBUG_DIR=str(d), OMP_NUM_THREADS="1")
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone",
                           "--nproc-per-node", "3", script], env=env, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode != 0
    assert sorted(os.listdir(d)) == ["flight-rank0.json", "flight-rank1.json"], proc.stderr[-2000:]
    res = analyze(str(d))
    # "failed" when the stop came first; "exited" when a waiter saw rank 2 gone before it
    assert res["culprits"] == [2] and res["faults"]["2"] in ("failed", "exited"), res
    assert (res["op"], res["seq"]) == ("all_reduce", 2), res

"""TILECOMM_TRACE and `tilecomm trace merge`: the merged file is a valid Chrome trace (checked
against the trace event format by trace_format.check_trace), one process per rank, calls with
their args, phases and per-peer waits nested inside them, clocks aligned."""

from __future__ import annotations

import json

import pytest
import torch

import tilecomm
from tilecomm.cli import main

from .trace_format import check_trace


def _work(comm):
    big = torch.ones(24 << 10)                # 96 KB: several pieces through 64 KB scratch
    comm.all_reduce(big, algo="ring")
    comm.all_gather(torch.ones(5))
    comm.broadcast(torch.ones(7), root=2)
    comm.barrier()
    if comm.rank < 2:
        (comm.send if comm.rank == 0 else comm.recv)(torch.ones(3), 1 - comm.rank)


def _contains(outer, inner, eps=1e-3):
    return outer["ts"] - eps <= inner["ts"] and \
        inner["ts"] + inner["dur"] <= outer["ts"] + outer["dur"] + eps


def test_merged_trace_is_valid_and_nested(trace_dir, tmp_path, capsys):
    tilecomm.launch(_work, 3, timeout=20, heap_bytes=1 << 20, scratch_bytes=64 << 10)
    out = tmp_path / "merged.json"
    assert main(["trace", "merge", str(trace_dir), "-o", str(out)]) == 0
    doc = json.loads(out.read_text())
    assert check_trace(doc) == []
    ev = doc["traceEvents"]
    names = {e["pid"]: e["args"]["name"] for e in ev if e["name"] == "process_name"}
    assert sorted(names) == [0, 1, 2] and names[1].startswith("rank 1 (")
    xs = [e for e in ev if e["ph"] == "X"]
    calls = [e for e in xs if e["cat"] == "collective"]
    for r in range(3):
        mine = [e["name"] for e in calls if e["pid"] == r]
        assert mine == ["init", "all_reduce", "all_gather", "broadcast", "barrier"] + \
            (["send"] if r == 0 else ["recv"] if r == 1 else []), mine
    ar = [e for e in calls if e["name"] == "all_reduce"]
    for e in ar:
        assert e["args"]["algorithm"] == "ring" and e["args"]["bytes"] == 96 << 10
        assert e["args"]["seq"] == 1 and e["args"]["op"] == "all_reduce"
    # phases (several pieces of the ring) lie inside their call; waits inside a phase
    phases = [e for e in xs if e["cat"] == "phase"]
    for p in phases:
        assert any(c["pid"] == p["pid"] and c["tid"] == p["tid"] and _contains(c, p)
                   for c in calls), p
    assert max(p["args"].get("piece", 0) for p in phases) >= 1
    waits = [e for e in xs if e["cat"] == "wait"]
    assert waits and all(w["name"] == f"wait rank {w['args']['peer']}" for w in waits)
    for w in waits:
        assert w["args"]["peer"] != w["pid"]
        assert any(p["pid"] == w["pid"] and _contains(p, w) for p in phases + calls), w
    # aligned clocks: every rank's part of one collective overlaps the others' (none can
    # finish before the last one arrived)
    for seq in range(5):
        spans = [(e["ts"], e["ts"] + e["dur"]) for e in calls if e["args"]["seq"] == seq]
        assert len(spans) == 3 and max(s for s, _ in spans) <= min(t for _, t in spans) + 1e-3


def test_the_checker_rejects_what_the_format_forbids():
    ok = {"name": "a", "ph": "X", "pid": 0, "tid": 0, "ts": 0.0, "dur": 10.0}
    assert check_trace({"traceEvents": [ok]}) == []
    partial = dict(ok, ts=5.0)          # starts inside `ok`, ends outside it
    assert check_trace({"traceEvents": [ok, partial]})
    assert check_trace({"traceEvents": [dict(ok, dur=None)]})
    assert check_trace({"traceEvents": [dict(ok, ph="Q")]})
    assert check_trace({"events": []})


def test_bench_trace_writes_a_merged_trace(tmp_path):
    d = tmp_path / "bt"
    assert main(["bench", "all_reduce", "-n", "2", "-b", "1K", "-e", "1K", "--iters", "2",
                 "--warmup", "1", "--rounds", "1", "--no-bound", "--trace", str(d)]) == 0
    doc = json.loads((d / "trace.json").read_text())
    assert check_trace(doc) == []
    calls = [e for e in doc["traceEvents"] if e.get("cat") == "collective"
             and e["name"] == "all_reduce"]
    assert {e["pid"] for e in calls} == {0, 1}
    assert all(e["args"]["bytes"] == 1024 for e in calls)


def test_merge_removes_the_clock_offset_between_hosts(tmp_path):
    """Rank 1's host clock runs 5 s ahead: after merging, both ranks leave the creation
    handshake at the same moment (each host's earliest departure is its mark)."""
    ahead = 5_000_000_000
    for r, (host, skew) in enumerate([("a", 0), ("b", ahead)]):
        base = 1_000_000_000 + skew
        ev = [{"name": "init", "cat": "collective", "ph": "X", "pid": r, "tid": 1,
               "ts": 10.0, "dur": 90.0, "args": {"seq": 0}}]
        meta = {"rank": r, "world_size": 2, "host": host, "pid": 100 + r, "base_ns": base,
                "sync_ns": base + 100_000, "dropped": 0}
        (tmp_path / f"trace-rank{r}.json").write_text(
            json.dumps({"traceEvents": ev, "tilecomm": meta}))
    from tilecomm.debug.trace import merge
    doc = merge(str(tmp_path))
    assert check_trace(doc) == []
    ends = [e["ts"] + e["dur"] for e in doc["traceEvents"] if e["ph"] == "X"]
    assert ends == [pytest.approx(ends[0])] * 2

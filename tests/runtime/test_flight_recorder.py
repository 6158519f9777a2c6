"""The flight recorder: what a record holds, the ring's bound, and the dumps (dump_flight,
SIGUSR1 while a rank is blocked). The torch backend's calls: tests/torch_backend."""

from __future__ import annotations

import json
import os
import signal
import time

import torch

import tilecomm
from tilecomm.debug.flight import FlightRecorder


def _calls(comm, path):
    t = torch.arange(6, dtype=torch.float64)
    comm.all_reduce(t, algo="two_shot")   # allowed in deterministic mode too
    comm.all_gather(torch.ones(3, dtype=torch.int32))
    comm.barrier()
    comm.alloc(4)
    if comm.rank == 0:
        comm.send(torch.ones(2), 1)
    else:
        comm.recv(torch.empty(2), 0)
    return comm.dump_flight(f"{path}-{comm.rank}.json")


def test_records_every_call_with_its_fields(rank_pool, tmp_path):
    paths = rank_pool(2).run(_calls, str(tmp_path / "d"))
    for r, path in enumerate(paths):
        doc = json.loads(open(path).read())
        assert (doc["rank"], doc["world_size"], doc["host"]) == (r, 2, os.uname().nodename)
        assert isinstance(doc["pid"], int) and doc["pid"] != os.getpid()
        (comm,) = [c for c in doc["comms"] if c["world_size"] == 2][-1:]
        recs = comm["records"][-5:]
        assert [x["op"] for x in recs] == ["all_reduce", "all_gather", "barrier", "alloc",
                                           "send" if r == 0 else "recv"]
        ar, ag, _, al, p2p = recs
        assert (ar["algorithm"], ar["bytes"], ar["dtype"]) == ("two_shot", 48, "float64")
        assert (ag["bytes"], ag["dtype"]) == (12, "int32") and al["bytes"] == 16
        # the ordered calls take consecutive numbers; send/recv are not numbered
        assert [x["seq"] for x in recs[1:4]] == [ar["seq"] + 1, ar["seq"] + 2, ar["seq"] + 3]
        assert p2p["seq"] is None and p2p["peers"] == [1 - r] and p2p["bytes"] == 8
        for x in recs:
            assert x["state"] == "completed" and x["error"] is None and x["wait"] is None
            assert x["issued_ns"] <= x["ended_ns"] and x["group"] == comm["id"]


def test_the_ring_keeps_the_last_n():
    fl = FlightRecorder(0, 1, 5)
    for i in range(20):
        fl.done(fl.issue("all_reduce", "direct", 4 * i, "float32"))
    doc = fl.to_json()
    assert [x["seq"] for x in doc["records"]] == [16, 17, 18, 19, 20]
    assert [x["bytes"] for x in doc["records"]] == [60, 64, 68, 72, 76]
    off = FlightRecorder(0, 1, 0)
    off.done(off.issue("all_reduce", "direct", 4, "float32"))
    assert not off.enabled and off.to_json()["records"] == []


def _blocked_dump(comm):
    """Rank 1 arrives late and, meanwhile, signals rank 0 (blocked in all_reduce) to dump."""
    pids = comm.all_gather(torch.tensor([os.getpid()]))
    if comm.rank == 1:
        time.sleep(0.6)
        os.kill(int(pids[0]), signal.SIGUSR1)
        time.sleep(0.4)
    comm.all_reduce(torch.ones(4))
    seq = comm.flight.next_seq - 1
    comm.barrier()      # rank 1 stays until rank 0 is past the dump and its all_reduce
    return seq


def test_sigusr1_dump_shows_what_a_blocked_rank_waits_for(debug_dir):
    last = tilecomm.launch(_blocked_dump, 2, timeout=20, heap_bytes=1 << 20)
    doc = json.loads((debug_dir / "flight-rank0.json").read_text())
    assert doc["reason"] == "SIGUSR1" and doc["rank"] == 0
    rec = doc["comms"][0]["records"][-1]
    assert (rec["op"], rec["seq"], rec["state"]) == ("all_reduce", last[0], "waiting")
    assert rec["wait"]["ranks"] == [1] and rec["wait"]["phase"] == "every rank to arrive"

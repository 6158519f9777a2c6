"""NOTE [the slow launch] (bench/machine.py): the probe, its verdict, and that tune never fits
on a launch in the slow state."""

import pytest

import tilecomm
from tilecomm.bench import machine
from tilecomm.tuning import sweep


def test_the_probe_times_a_rewrite_of_peer_read_memory_on_rank_0():
    got = tilecomm.launch(machine.probe, 2)
    assert got[1] is None
    assert got[0]["rewrite_us"] > 0 and got[0]["local_us"] > 0
    v = machine.verdict(got)
    assert v["ratio"] == pytest.approx(got[0]["rewrite_us"] / got[0]["local_us"])
    assert "cross-core write probe" in machine.describe(v)


def test_the_verdict_is_slow_above_the_ratio_and_takes_the_worst_host():
    fast, slow = {"rewrite_us": 210.0, "local_us": 70.0}, {"rewrite_us": 900.0, "local_us": 45.0}
    assert not machine.verdict([fast, None])["slow"]
    v = machine.verdict([fast, None, slow])
    assert v["slow"] and v["ratio"] == pytest.approx(20.0)
    assert machine.verdict([None, None]) is None
    assert "SLOW" in machine.describe(v)


def test_tune_refuses_to_fit_on_a_slow_launch(monkeypatch):
    from tilecomm.bench import runner

    rows = [{"collective": "all_reduce", "algo": "one_shot", "world_size": 2, "bytes": 16,
             "time_us": 30.0, "machine_slow": True, "machine_ratio": 21.0}]
    monkeypatch.setattr(runner, "run", lambda cfg, progress=None: rows)
    with pytest.raises(sweep.SlowLaunch, match="slow state.*nothing was stored"):
        sweep.one_host(2)

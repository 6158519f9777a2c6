"""algo="auto" by predicted cost (tilecomm.tuning, NOTE [auto by predicted cost]): the curves,
the choice against the predictions it ranks, the tune file, and what a communicator records."""

from __future__ import annotations

import json
import math
import warnings
from dataclasses import asdict

import pytest
import torch

from tilecomm import tuner
from tilecomm.algorithms.lower import deterministic_algorithms
from tilecomm.algorithms.registry import algorithms
from tilecomm.hier.layout import HostLayout
from tilecomm.hier.plans import hier_algorithms
from tilecomm.settings import settings
from tilecomm.topology.presets import CPU_SHM_COST
from tilecomm.tuning import costs, store
from tilecomm.tuning.costs import ENGINE, CostModel, bucket, curve_key
from tilecomm.tuning.curves import Curve


def test_curve_interpolates_in_log_log_and_extends_beyond_its_points():
    c = Curve.of([(1024, 10.0), (4096, 40.0), (16384, 100.0)])
    assert c.at(1024) == 10.0 and c.at(4096) == pytest.approx(40.0)
    assert c.at(2048) == pytest.approx(20.0)          # t ~ n between 1 and 4 KiB: halfway in log
    assert c.at(8) == 10.0                            # below: the fixed cost
    slope = (100.0 - 40.0) / (16384 - 4096)
    assert c.at(1 << 20) == pytest.approx(100.0 + slope * ((1 << 20) - 16384))
    with pytest.raises(ValueError, match="increasing"):
        Curve.of([(4096, 1.0), (4096, 2.0)])
    with pytest.raises(ValueError, match="positive"):
        Curve.of([(8, 0.0)])


def test_buckets_keep_powers_of_two_and_are_monotonic():
    assert [bucket(1 << k) for k in range(30)] == [1 << k for k in range(30)]
    sizes = [int(1.07 ** k) + 1 for k in range(300)]
    got = [bucket(n) for n in sizes]
    assert got == sorted(got)
    # within half a grid step, plus the rounding to whole bytes
    assert all(abs(math.log2(b / n)) <= 1 / (2 * costs.GRID) + math.log2(1 + 0.5 / n)
               for b, n in zip(got, sizes))


@pytest.mark.parametrize("collective", ["all_reduce", "all_gather", "reduce_scatter",
                                        "broadcast", "all_to_all"])
def test_auto_takes_the_lowest_prediction_on_one_host(collective):
    model = CostModel({0: CPU_SHM_COST})
    for w in (2, 3, 4):
        for n in (8, 3000, 64 << 10, 1 << 20, 48 << 20):
            ch = tuner.decide(collective, n, w, model=model)
            preds = {a: model.predict(collective, a, n, w, kind="cpu")
                     for a in algorithms(collective)}
            assert dict(ch.ranked) == pytest.approx(preds)
            best = min(preds.values())
            assert preds[ch.algo] <= best * (1 + costs.TIE), (collective, w, n, ch)


def test_ties_go_to_fewer_synchronizations(monkeypatch):
    """Two candidates predicted the same: the one whose plan synchronizes less."""
    model = CostModel({0: CPU_SHM_COST})
    monkeypatch.setattr(costs, "_predict", lambda *a: 5.0)
    costs._choose.cache_clear()
    try:
        ch = tuner.decide("all_reduce", 1 << 20, 4, model=model)
        syncs = {a: costs._syncs("all_reduce", a, 1 << 20, 4, "cpu", "user")
                 for a in algorithms("all_reduce")}
        assert syncs[ch.algo] == min(syncs.values()), (ch, syncs)
    finally:
        costs._choose.cache_clear()


def test_measured_curves_decide_across_hosts_and_the_model_fills_in():
    lay = HostLayout.even(2, 2)
    cands = hier_algorithms("all_reduce", lay) + [ENGINE]
    base = CostModel({0: CPU_SHM_COST})
    # without curves: the hierarchical model and the engine model give finite times for all
    ch = tuner.decide("all_reduce", 4096, 4, kind="hier", available=cands, layout=lay,
                      model=base)
    assert all(math.isfinite(t) for _, t in ch.ranked) and len(ch.ranked) == len(cands)
    # measured: the engine fast below 64 KiB, slow above; hier_rail the reverse
    curves = {curve_key(lay, "all_reduce", a): Curve.of([(8, 500.0), (1 << 24, 90000.0)])
              for a in cands}
    curves[curve_key(lay, "all_reduce", ENGINE)] = Curve.of([(8, 50.0), (64 << 10, 400.0),
                                                             (1 << 24, 200000.0)])
    curves[curve_key(lay, "all_reduce", "hier_rail")] = Curve.of([(8, 900.0), (1 << 24, 20000.0)])
    m = CostModel({0: CPU_SHM_COST}, curves, source="test")
    pick = [tuner.choose("all_reduce", n, 4, kind="hier", available=cands, layout=lay, model=m)
            for n in (8, 1024, 4 << 20, 1 << 24)]
    assert pick == [ENGINE, ENGINE, "hier_rail", "hier_rail"]
    # another layout has no curves: the model, not the 2+2 measurements
    lay3 = HostLayout.even(3, 2)
    got = m.predict("all_reduce", ENGINE, 8, 6, kind="hier", layout=lay3)
    assert got == pytest.approx(costs.engine_model_us("all_reduce", 8, 6, CPU_SHM_COST))


def test_deterministic_candidates_are_the_only_ones_ranked():
    ok = deterministic_algorithms("all_reduce", 4, 0)
    ch = tuner.decide("all_reduce", 1 << 20, 4, available=ok)
    assert {a for a, _ in ch.ranked} == set(ok) and ch.algo in ok


@pytest.fixture
def tune_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("TILECOMM_TUNE_DIR", str(tmp_path))
    monkeypatch.setenv("TILECOMM_TUNE", "1")
    settings.cache_clear()
    store.current.cache_clear()
    yield tmp_path
    settings.cache_clear()
    store.current.cache_clear()


def test_the_tune_file_is_used_later_and_merges_layouts(tune_dir):
    assert store.current().source.startswith("shipped")
    fitted = {"params": {**asdict(CPU_SHM_COST), "sync_us": 9.0}}
    p = store.save({"shm": {2: fitted}}, "tilecomm tune -n 2")
    lay = HostLayout.even(2, 2)
    key = curve_key(lay, "broadcast", ENGINE)
    store.save({"curves": {key: [[8, 11.0], [1024, 12.0]]}}, "tilecomm tune -n 4 --hosts 2")
    assert p.name == f"tune-{store.fingerprint()}.json" and p.parent == tune_dir
    m = store.current()
    assert m.source == f"tuned: {p}"
    assert m.shm_for(2).sync_us == 9.0 and m.shm_for(3) == CPU_SHM_COST
    assert m.predict("broadcast", ENGINE, 8, 4, kind="hier", layout=lay) == 11.0
    data = json.loads(p.read_text())
    assert [r["command"] for r in data["runs"]] == ["tilecomm tune -n 2",
                                                    "tilecomm tune -n 4 --hosts 2"]
    assert m.digest() != store.defaults().digest()


def test_a_broken_tune_file_is_reported_and_ignored(tune_dir):
    store.path().parent.mkdir(parents=True, exist_ok=True)
    store.path().write_text("{not json")
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        m = store.current()
    assert m.source.startswith("shipped")
    assert any("ignoring the tune file" in str(x.message) for x in w)


def _auto_record(comm):
    x = torch.randn(1000)
    comm.all_reduce(x)
    rec = comm.flight.to_json()["records"][-1]
    return comm.last_auto.to_json(), rec["note"], rec["algorithm"], comm.costs.source


def test_a_communicator_records_why_auto_chose(rank_pool):
    out = rank_pool(2).run(_auto_record)
    (choice, note, algo, source), other = out
    assert choice == other[0], "every rank made the same choice"
    assert choice["algo"] == algo and note.startswith(f"auto: predicted {algo}")
    assert len(choice["ranked"]) == len(algorithms("all_reduce")) and source.startswith("shipped")


def test_ranks_whose_cost_models_differ_fall_back_to_the_shipped_ones():
    import tilecomm

    def settle(comm):
        mine = comm.costs_word()
        comm.settle_costs([mine, mine])
        same = comm.costs.source
        comm.settle_costs([mine, mine + 1])
        return same, comm.costs.source, comm.costs.digest() == store.defaults().digest()

    for same, differ, is_default in tilecomm.launch(settle, 2):
        assert same.startswith("shipped") and "tune files differ" in differ and is_default

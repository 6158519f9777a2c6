"""Leave-one-system-out validation, --library nccl, bands, class latencies of presets."""

import json
import os

import pytest

from tilecomm.sim import crossreport
from tilecomm.sim import crossval as cv
from tilecomm.sim import published
from tilecomm.sim.cli import main as cli_main
from tilecomm.sim.ncclsim import DEFAULT, nccl_choice, nccl_rows
from tilecomm.topology import build, get_preset


def _row(system, nbytes, t, preset="hgx-h200", algos=("nvls",), gpus=8, nodes=1):
    return published.Row(system, preset, "all_reduce", gpus, nodes, nbytes, t, algos, "test",
                         get_preset(preset))


def _rows():
    return published.load()


def test_every_published_row_has_a_source_and_a_described_system():
    import csv
    systems = published.load_systems()
    for path in published.default_sweeps():
        with open(path) as f:
            rows = list(csv.DictReader(f))
        assert rows and all(r["source"].strip() for r in rows), path
    assert len(systems) >= 15
    loaded = _rows()
    assert {r.system for r in loaded} <= set(systems)
    assert len({r.system for r in loaded}) >= 15


@pytest.fixture(scope="module")
def loso():
    """Leave one system out over every published row (computed once: ~7 s)."""
    rows = _rows()
    return rows, cv.cross_validate(rows)[0]


def test_loso_never_gives_the_held_out_system_or_its_twins_to_the_fit():
    rows = _rows()
    twins = {r.system for r in rows if r.group == "aws-p4d"}
    assert len(twins) >= 3                              # one machine type under several ids
    keep = sorted({r.system for r in rows})[:6] + sorted(twins)   # keeps the test quick
    rows = [r for r in rows if r.system in keep]
    sentinel = "SENTINEL-SYSTEM"
    rows.append(_row(sentinel, 1024, 1e6))    # absurd: would drag host_us to ~1e6 if seen
    seen = []

    def spy_fit(train):
        seen.append({r.system for r in train})
        return cv.fit(train)

    checks, params = cv.cross_validate(rows, fit_fn=spy_fit)
    units = sorted({r.unit for r in rows})
    assert len(seen) == len(units)
    for held, train_systems in zip(units, seen):
        members = {r.system for r in rows if r.unit == held}
        assert not members & train_systems
        assert train_systems == {r.system for r in rows} - members  # every other one is used
    # the sentinel's own prediction comes from a fit that never saw its absurd row
    assert params[sentinel].host_us < 100
    assert {c.row.system for c in checks} == {r.system for r in rows}


def test_including_the_system_in_the_fit_changes_its_prediction():
    rows = _rows()
    held = "gcp-a3-mega"      # its latency regime (~125 us) is far from the others'
    loso = cv.fit([r for r in rows if r.system != held])
    full = cv.fit(rows)
    r = next(x for x in rows if x.system == held and x.nbytes == 1024)
    assert cv.predict_row(r, loso).time_us != pytest.approx(cv.predict_row(r, full).time_us,
                                                            rel=1e-3)


def test_fit_recovers_host_overhead():
    rows = [_row("a", 1024, 0.0), _row("b", 2048, 0.0)]
    for r in rows:
        r.time_us = nccl_choice("all_reduce", r.nbytes, r.topo(), DEFAULT.with_(host_us=0.0),
                                r.algos).time_us + 9.0
    assert cv.fit(rows).host_us == pytest.approx(9.0, abs=1e-6)


def test_fit_json_matches_data_and_bands_are_ordered():
    prm, bands = cv.load_fit()
    assert {"latency", "middle", "bandwidth"} <= set(bands) <= {"latency", "middle", "bandwidth",
                                                                "unseen_network"}
    for reg in ("latency", "middle", "bandwidth"):
        assert bands[reg]["q16"] <= bands[reg]["q84"]
    with open(cv.FIT_JSON) as f:
        assert len(json.load(f)["systems"]) >= 8
    assert prm.host_us > 0


def test_nccl_choice_switches_algorithm_with_size():
    t = build("hgx-h200")
    small = nccl_choice("all_reduce", 1024, t)
    large = nccl_choice("all_reduce", 1 << 30, t)
    assert (small.algo, small.protocol) == ("ring", "LL")
    assert large.algo == "nvls"
    assert 10 < small.time_us < 40      # Hopper nodes measure ~12-30 us at 1 KB
    a100 = nccl_choice("all_reduce", 1 << 30, build("dgx-a100"))
    assert (a100.algo, a100.protocol) == ("ring", "Simple")   # no NVLS on A100


def test_multinode_ring_uses_every_nic():
    t = build("dgx-h100", nodes=4)
    r = [x for x in nccl_rows("all_reduce", 8 << 30, t, algos=("ring",))
         if x.protocol == "Simple"][0]
    # node-NIC bound: busbw ~ 8 NICs x 48.5 x net_eff, not one NIC's 48.5
    assert r.bound == "net" and r.busbw_GBps > 8 * 48.5 * 0.5


def test_cli_library_nccl_rows_labelled_with_bands(tmp_path):
    out = tmp_path / "n.json"
    assert cli_main(["sim", "all_reduce", "--system", "dgx-b200", "--library", "nccl",
                     "-b", "1K", "-e", "1G", "-f", "1024", "--json", str(out)]) == 0
    d = json.loads(out.read_text())
    assert d["library"] == "nccl"
    best = [r for r in d["predictions"] if r["best"]]
    assert len(best) == 3
    for r in d["predictions"]:
        assert r["library"] == "nccl" and r["algo"] and r["protocol"]
        assert r["low_us"] <= r["time_us"] <= r["high_us"]


def test_cli_tilecomm_rows_have_bands(tmp_path):
    out = tmp_path / "t.json"
    assert cli_main(["sim", "all_reduce", "--system", "hgx-h200", "-b", "1K", "-e", "1K",
                     "--json", str(out)]) == 0
    d = json.loads(out.read_text())
    assert d["library"] == "tilecomm"
    assert all("low_us" in r and "high_us" in r and r["library"] == "tilecomm"
               for r in d["predictions"])


@pytest.mark.parametrize("name", ["dgx-a100", "dgx-h100", "hgx-h200", "dgx-b200",
                                  "gb200-nvl72", "pcie-8gpu"])
def test_gpu_presets_have_class_latency_with_source(name):
    s = get_preset(name)
    assert s.launch_us > 0
    assert "host_us" in s.sources["launch_us"]


def test_hgx_h200_small_message_no_longer_7us():
    from tilecomm.sim import best
    assert best("all_reduce", 1024, system="hgx-h200").time_us > 10


def test_loso_accuracy_first_milestone(loso):
    _, checks = loso
    t = cv.table(checks)["ALL"]
    assert t["latency"][1] <= 0.35
    assert t["bandwidth"][1] <= 0.15


def test_options_pat_and_sharp():
    from dataclasses import replace
    t = build("dgx-h100", nodes=64, gpus=1)
    assert nccl_choice("all_gather", 1024, t).algo == "pat"      # log-latency at 1 GPU/node
    spec = get_preset("dgx-h100")
    plain = build(spec, nodes=16)
    sharp = build(spec.with_(fabric=replace(spec.fabric, sharp=True)), nodes=16)
    assert all(r.algo != "collnet" for r in nccl_rows("all_reduce", 1 << 30, plain))
    assert any(r.algo == "collnet" for r in nccl_rows("all_reduce", 1 << 30, sharp))


def test_api_predict_nccl_and_band():
    from tilecomm.sim import band, predict_nccl
    r = predict_nccl("all_reduce", 1 << 30, system="dgx-b200")[0]
    assert r.algo == "nvls"
    lo, hi = band(r.time_us, r.nbytes)
    assert lo <= r.time_us <= hi
    with pytest.raises(ValueError, match="GPU system"):
        predict_nccl("all_reduce", 1024, system="cpu-shm")


def test_oversubscribed_spine_bounds_multinode_ring():
    from dataclasses import replace
    spec = get_preset("dgx-h100")
    thin = spec.with_(fabric=replace(spec.fabric, oversubscription=2.0, nodes_per_leaf=4))
    rows = lambda sp, n: [r for r in nccl_rows("all_reduce", 8 << 30, build(sp, nodes=n),
                                               algos=("ring",)) if r.protocol == "Simple"][0]
    assert rows(thin, 4).busbw_GBps == pytest.approx(rows(spec, 4).busbw_GBps)   # one leaf
    assert rows(thin, 8).busbw_GBps == pytest.approx(rows(spec, 8).busbw_GBps / 2, rel=0.02)


def test_docs_headline_and_fit_file_are_current(loso):
    rows, checks = loso
    head = crossreport.headline(checks)
    root = os.path.join(os.path.dirname(__file__), "..", "..")
    for doc in ("docs/model.md", "README.md"):
        text = open(os.path.join(root, doc)).read()
        assert head.replace("\n", " ") in text.replace("\n", " "), (doc, head)
    prm, bands = cv.load_fit()
    fitted = cv.fit(rows).as_dict()
    stored = prm.as_dict()
    assert stored.pop("net") == {k: pytest.approx(v, rel=1e-9) for k, v in fitted.pop("net").items()}
    assert stored == pytest.approx(fitted, rel=1e-9)
    fresh = cv.bands(checks)
    assert set(bands) == set(fresh)
    for reg in ("latency", "middle", "bandwidth"):
        assert bands[reg] == pytest.approx(fresh[reg])
    for reg, b in fresh.get("unseen_network", {}).items():
        assert bands["unseen_network"][reg] == pytest.approx(b)

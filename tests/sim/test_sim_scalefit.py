"""Fit small, predict large: nccl-tests logs -> a system's own parameters -> other node counts."""

import json

import pytest

from tilecomm.sim import crossval as cv
from tilecomm.sim import published, scalefit
from tilecomm.sim.cli import main as cli_main
from tilecomm.sim.measured import parse_nccl_tests
from tilecomm.sim.ncclsim import NetClass, nccl_choice
from tilecomm.topology import build, get_preset

SIZES = [1 << k for k in range(10, 34, 2)]


def _log(times: dict, nodes: int, gpus: int = 8, coll: str = "all_reduce") -> str:
    """An nccl-tests log (header, rank lines naming hosts, the table) with ``times`` (us)."""
    lines = [f"# Collective test starting: {coll}_perf",
             "# nThread 1 nGpus 1 minBytes 1024 maxBytes 8589934592 step: 4(factor) warmup "
             "iters: 5 iters: 20 agg iters: 1 validation: 1 graph: 0", "#"]
    for r in range(nodes * gpus):
        lines.append(f"#  Rank {r:2d} Group  0 Pid {1000 + r} on    node-{r // gpus} device "
                     f"{r % gpus:2d} [0x{r:02x}] NVIDIA H100 80GB HBM3")
    lines.append("#       size         count      type   redop    root     time   algbw   busbw "
                 "#wrong     time   algbw   busbw #wrong")
    for n, t in times.items():
        lines.append(f"{n:12d} {n // 4:12d}     float     sum      -1  {t:8.2f}  0.00  0.00  0  "
                     f"{t:8.2f}  0.00  0.00  0")
    return "\n".join(lines) + "\n"


def test_parser_counts_hosts_and_keeps_the_collective():
    ms = parse_nccl_tests(_log({1024: 40.0, 4096: 41.0}, nodes=2))
    assert [m.nodes for m in ms] == [2, 2]
    assert {m.world_size for m in ms} == {16}
    assert {m.collective for m in ms} == {"all_reduce"}


def _spec():
    """Two NICs per node: large calls across nodes are network-bound (the fit reads the
    network's efficiency from rows the model predicts network-bound)."""
    return get_preset("dgx-h100").with_(nics_per_node=2)


def _truth():
    """A system unlike the class fit: slow calls, a slow lossy network."""
    prm, _ = cv.load_fit()
    net = dict(prm.net)
    net["ib"] = NetClass(eff=0.45, lat_us=25.0)
    return prm, prm.with_(host_us=prm.host_us + 12.0, net=net)


def test_fit_on_two_nodes_recovers_the_system_and_predicts_eight():
    prm, truth = _truth()
    spec = _spec()
    t2 = {n: nccl_choice("all_reduce", n, build(spec, 2), truth).time_us for n in SIZES}
    t1 = {n: nccl_choice("all_reduce", n, build(spec, 1), truth).time_us for n in SIZES}
    rows = scalefit.rows_of(parse_nccl_tests(_log(t2, 2)) + parse_nccl_tests(_log(t1, 1)), spec)
    own = scalefit.fit_own(rows, prm)
    assert own.host_us == pytest.approx(truth.host_us, rel=0.05)
    assert own.net["ib"].eff == pytest.approx(0.45, rel=0.05)
    assert own.net["ib"].lat_us == pytest.approx(25.0, rel=0.1)
    for n in (1 << 12, 1 << 30):
        want = nccl_choice("all_reduce", n, build(spec, 8), truth).time_us
        got = nccl_choice("all_reduce", n, build(spec, 8), own).time_us
        before = nccl_choice("all_reduce", n, build(spec, 8), prm).time_us
        assert abs(got / want - 1) < 0.05 < abs(before / want - 1)


def test_cli_fit_predicts_other_node_counts(tmp_path):
    _, truth = _truth()
    spec = _spec()
    t2 = {n: nccl_choice("all_reduce", n, build(spec, 2), truth).time_us for n in SIZES}
    log = tmp_path / "two_nodes.txt"
    log.write_text(_log(t2, 2))
    system = tmp_path / "two_nics.json"
    system.write_text(json.dumps({"base": "dgx-h100", "nics_per_node": 2}))
    out = tmp_path / "p.json"
    assert cli_main(["sim", "all_reduce", "--system", str(system), "--library", "nccl",
                     "--nodes", "16", "-b", "1G", "-e", "1G", "--fit", str(log),
                     "--json", str(out)]) == 0
    best = [r for r in json.loads(out.read_text())["predictions"] if r["best"]][0]
    want = nccl_choice("all_reduce", 1 << 30, build(spec, 16), truth).time_us
    assert best["time_us"] == pytest.approx(want, rel=0.05)
    assert "fit-small-predict-large" in best["band_source"]


def test_cli_fit_refuses_the_tilecomm_library_and_headerless_logs(tmp_path, capsys):
    log = tmp_path / "x.txt"
    log.write_text(_log({1024: 30.0}, 2))
    with pytest.raises(SystemExit):
        cli_main(["sim", "all_reduce", "--fit", str(log)])
    assert "--library nccl" in capsys.readouterr().err
    log.write_text("\n".join(_log({1024: 30.0}, 2).splitlines()[1:]))
    with pytest.raises(SystemExit):
        cli_main(["sim", "all_reduce", "--library", "nccl", "--fit", str(log)])
    assert "cannot tell the collective" in capsys.readouterr().err


def test_scale_checks_never_score_a_row_the_own_fit_saw(monkeypatch):
    rows = published.load()
    seen, own_rows = [], []

    def spy(train):
        seen.append({r.system for r in train})
        return cv.fit(train)

    def spy_own(rs, start=None):
        own_rows.append({id(r) for r in rs})
        return real_own(rs, start)

    real_own = scalefit.fit_own
    monkeypatch.setattr(scalefit, "fit_own", spy_own)
    checks = scalefit.scale_checks(rows, fit_fn=spy)
    multi = sorted({r.system for r in rows if len({x.nodes for x in rows
                                                   if x.system == r.system and x.nodes > 1}) >= 2})
    assert len(seen) == len(own_rows) == len(multi) >= 3
    fitted = set().union(*own_rows)
    assert checks and not {id(sc.check.row) for sc in checks} & fitted
    for held, train, own in zip(multi, seen, own_rows):
        unit = next(r.unit for r in rows if r.system == held)
        assert not {r.system for r in rows if r.unit == unit} & train   # nor its twins
        assert own and all(r.system == held for r in rows if id(r) in own)


def test_one_file_of_several_runs_gives_each_run_its_collective_ranks_and_hosts():
    text = _log({1024: 20.0, 2048: 21.0}, 1) + _log({4096: 50.0}, 2, coll="all_gather")
    got = [(m.collective, m.world_size, m.nodes) for m in parse_nccl_tests(text)]
    assert got == [("all_reduce", 8, 1), ("all_reduce", 8, 1), ("all_gather", 16, 2)]


def test_a_one_node_fit_learns_nothing_of_the_network_and_keeps_its_band(tmp_path):
    log = tmp_path / "one_node.txt"
    log.write_text(_log({1024: 30.0, 1 << 30: 9000.0}, 1))
    system = tmp_path / "unsaid.json"     # the network unsaid: the wide band, fit or not
    system.write_text(json.dumps({"base": "dgx-h100", "fabric": {"transport": ""}}))
    out = tmp_path / "p.json"
    assert cli_main(["sim", "all_reduce", "--system", str(system), "--library", "nccl",
                     "--nodes", "8", "-b", "1K", "-e", "1K", "--fit", str(log),
                     "--json", str(out)]) == 0
    best = [r for r in json.loads(out.read_text())["predictions"] if r["best"]][0]
    assert "fit-small-predict-large" not in best["band_source"]
    assert "leave-one-system-out" in best["band_source"]
    assert "does not say its fabric.transport" in best["band_source"]


def test_library_models_refuse_the_other_vendor_and_a_one_gpu_mesh():
    with pytest.raises(ValueError, match="use --library rccl"):
        nccl_choice("all_reduce", 1 << 20, build("mi300x"))
    from tilecomm.sim.rcclsim import rccl_choice
    with pytest.raises(ValueError, match="no Infinity Fabric link"):
        rccl_choice("all_reduce", 1 << 20, build("mi300x", 2, 1))

"""The hierarchical runtime's cost model (sim/hosts.py): counts from the plans, the link fit,
and the shape of its predictions. No simulated hosts needed."""

import json

import pytest

from tilecomm.hier.layout import HostLayout
from tilecomm.hier.plans import hier_algorithms, hier_plan
from tilecomm.sim import hosts as H
from tilecomm.topology.presets import CPU_SHM_COST

LAY = HostLayout.even(2, 2)
COST = H.HostsCost(H.Link(120.0, 0.8), H.Link(70.0, 1.6), CPU_SHM_COST)


def _work(coll, algo, nbytes, rank=0, lay=LAY):
    plan = hier_plan(coll, algo, lay, 0, rank)
    return H.plan_work(plan, H.caller_count(coll, nbytes, lay.world_size))


def test_rail_first_small_all_reduce_is_one_header_round_and_one_local_call():
    rail, local, copy = _work("all_reduce", "hier_rail_first", 8)
    assert (rail.kind, rail.rounds, rail.header_rounds) == ("rail", 1, 1)
    assert rail.recv_bytes == H.HEADER          # the 8 B rode in the other member's header
    assert rail.add_bytes == 8                  # one add of the other host's 8 B
    assert local.local == ("all_reduce", "one_shot", 2, 8)
    assert (copy.kind, copy.copy_bytes) == ("copy", 8)


def test_rail_all_reduce_of_1mb_takes_two_rounds_over_half_the_buffer():
    rs, rail, ag = _work("all_reduce", "hier_rail", 1 << 20)
    assert rs.local[:3] == ("reduce_scatter", "direct", 2) and rs.local[3] == 1 << 20
    assert (rail.rounds, rail.header_rounds) == (2, 1)
    assert rail.recv_bytes == H.HEADER + (1 << 19)   # rail l carries chunk l: half the buffer
    assert ag.local == ("all_gather", "direct", 2, 1 << 19)


def test_payload_at_the_header_limit_takes_one_round_and_just_above_two():
    assert _work("all_reduce", "hier_rail_first", H.SMALL)[0].rounds == 1
    assert _work("all_reduce", "hier_rail_first", H.SMALL + 4)[0].rounds == 2


def test_all_gather_of_three_hosts_receives_two_payloads_per_round():
    lay = HostLayout.even(3, 1)
    n = 3 * 65536                           # bench size: the output; 64 KiB per rank
    rail = _work("all_gather", "hier_rail", n, lay=lay)[0]
    assert rail.rounds == 2 and rail.recv_bytes == 2 * (H.HEADER + 65536)
    assert rail.copy_bytes == 3 * 65536


def test_leader_step_uses_the_one_rail_link_and_idle_ranks_do_nothing():
    idle = _work("all_reduce", "hier_leader", 1 << 20, rank=1)[1]
    assert idle.kind == "rail" and not idle.busy and idle.rounds == 0
    steps = H.breakdown("all_reduce", "hier_leader", LAY, 1 << 20, COST)
    rail_us = steps[1][1]
    w = _work("all_reduce", "hier_leader", 1 << 20)[1]
    assert rail_us == pytest.approx(H.step_us(w, COST, COST.one))
    assert rail_us != pytest.approx(H.step_us(w, COST, COST.both))


def test_fit_recovers_a_known_link():
    alpha, beta = 85.0, 1.25
    pts = [(n, alpha + 1e-3 * n / beta) for n in (4224, 32768, 1 << 18, 1 << 21, 1 << 24)]
    link = H.fit_link(pts)
    assert link.alpha_us == pytest.approx(alpha, rel=1e-6)
    assert link.beta_GBps == pytest.approx(beta, rel=1e-6)


def test_load_link_fits_each_mode_from_a_hosts_link_file(tmp_path):
    rows = [{"mode": m, "bytes": n, "time_us": a + 1e-3 * n / b}
            for m, a, b in (("both", 150.0, 0.5), ("one", 60.0, 2.0))
            for n in (4224, 1 << 16, 1 << 22)]
    path = tmp_path / "link.json"
    path.write_text(json.dumps({"rows": rows, "hosts": 2}))
    cost, _ = H.load_link(str(path))
    assert cost.both.alpha_us == pytest.approx(150.0) and cost.both.beta_GBps == pytest.approx(0.5)
    assert cost.one.alpha_us == pytest.approx(60.0) and cost.one.beta_GBps == pytest.approx(2.0)
    path.write_text(json.dumps({"rows": rows[:4], "hosts": 2}))
    with pytest.raises(ValueError, match="'one' rows"):
        H.load_link(str(path))


@pytest.mark.parametrize("coll", ["all_reduce", "all_gather", "reduce_scatter"])
def test_predictions_grow_with_size(coll):
    sizes = [8 << (3 * k) for k in range(9)]           # 8 B .. 128 MiB by 8x
    for algo in hier_algorithms(coll, LAY):
        ts = [H.predict_us(coll, algo, LAY, n, COST) for n in sizes]
        assert all(b >= a for a, b in zip(ts, ts[1:])), (algo, ts)
        # a small call is at least the outer call, one header round and its local calls
        assert ts[0] > COST.shm.call_us + min(COST.both.alpha_us, COST.one.alpha_us)


def test_predict_cli_prints_rows_and_regimes(tmp_path, capsys):
    link = tmp_path / "link.json"
    link.write_text(json.dumps({"hosts": 2, "rows": [
        {"mode": m, "bytes": n, "time_us": 100.0 + n / 1000.0}
        for m in ("both", "one") for n in (4224, 1 << 20)]}))
    bench = tmp_path / "bench.json"
    bench.write_text(json.dumps([
        {"collective": "all_reduce", "algo": a, "world_size": 4, "bytes": n,
         "dtype": "float32", "time_us": 500.0}
        for a in ("hier_rail", "hier_rail_first") for n in (8, 1 << 20, 1 << 24)]
        + [{"collective": "all_reduce", "algo": "gloo", "world_size": 4, "bytes": 8,
            "time_us": 1.0}]))
    assert H.main(["predict", str(link), str(bench)]) == 0
    out = capsys.readouterr().out
    assert "| all_reduce | 16M | hier_rail_first |" in out
    assert "gloo" not in out.split("| collective | size |")[1]
    for reg in ("small", "medium", "large"):
        assert f"| all_reduce | {reg} |" in out


def test_local_steps_fit_recovers_a_known_wake_and_slow_down(tmp_path):
    wake, slow = 400.0, 1.7
    rows = [{"collective": c, "bytes": n,
             "time_us": wake + slow * H.local_alone_us(CPU_SHM_COST, c, n, 2)}
            for c in ("reduce_scatter", "all_gather", "broadcast") for n in (64, 1 << 16, 1 << 23)]
    lo = H.fit_local(rows, CPU_SHM_COST, 2)
    assert lo.wake_us == pytest.approx(wake, rel=1e-6)
    assert lo.slow == pytest.approx(slow, rel=1e-6)
    # through the files and the CLI: the local steps of a prediction carry both terms
    link = tmp_path / "link.json"
    link.write_text(json.dumps({"hosts": 2, "rows": [
        {"mode": m, "bytes": n, "time_us": 100.0 + n / 1000.0}
        for m in ("both", "one") for n in (4224, 1 << 20)]}))
    local = tmp_path / "local.json"
    local.write_text(json.dumps({"rows": rows, "per_host": 2}))
    cost, _ = H.load_link(str(link), local_path=str(local))
    plain, _ = H.load_link(str(link))
    steps = dict(H.breakdown("all_reduce", "hier_rail", LAY, 1 << 20, cost))
    plain_steps = dict(H.breakdown("all_reduce", "hier_rail", LAY, 1 << 20, plain))
    assert steps["rail"] == pytest.approx(plain_steps["rail"])
    assert steps["local"] == pytest.approx(wake + slow * plain_steps["local"], rel=1e-6)
    assert H.main(["fit", str(link), "--local", str(local)]) == 0


def test_rail_wake_is_the_median_excess_and_is_charged_after_local_steps_only(tmp_path):
    link = tmp_path / "link.json"
    link.write_text(json.dumps({"hosts": 2, "primitive": "pairwise", "rows": [
        {"mode": m, "bytes": n, "time_us": 100.0 + n / 1000.0}
        for m in ("both", "one") for n in (4224, 1 << 20)]}))
    rows = [{"collective": "broadcast", "bytes": n, "time_us": 300.0 + n / 100.0}
            for n in (64, 1 << 16, 1 << 23)]
    # rail rounds after a local step: 250, 260 and 1000 us over the back-to-back fit
    rail_rows = [{"mode": "both", "bytes": 4224, "time_us": 100.0 + 4.224 + 250.0},
                 {"mode": "one", "bytes": 4224, "time_us": 100.0 + 4.224 + 260.0},
                 {"mode": "both", "bytes": 1 << 20, "time_us": 100.0 + 1048.576 + 1000.0}]
    local = tmp_path / "local.json"
    local.write_text(json.dumps({"rows": rows, "rail_rows": rail_rows, "per_host": 2}))
    cost, _ = H.load_link(str(link), local_path=str(local))
    assert cost.local.rail_wake_us == pytest.approx(260.0, rel=1e-3)
    no_rail = H.HostsCost(cost.both, cost.one, cost.shm,
                          H.LocalSteps(cost.local.wake_us, cost.local.slow))
    # hier_rail all_reduce: local, rail (after a local step: charged), local
    with_w = H.breakdown("all_reduce", "hier_rail", LAY, 1 << 20, cost)
    without = H.breakdown("all_reduce", "hier_rail", LAY, 1 << 20, no_rail)
    assert [k for k, _ in with_w] == ["local", "rail", "local"]
    assert with_w[1][1] == pytest.approx(without[1][1] + cost.local.rail_wake_us)
    assert with_w[0][1] == pytest.approx(without[0][1])
    # hier_rail_first starts with its rail step: it follows the previous call's last
    # synchronizing step (back-to-back calls), a local all_reduce
    first = _work("all_reduce", "hier_rail_first", 8)
    assert first[0].kind == "rail" and not first[0].after_inter_host
    # reduce_scatter/hier_rail is Copy, Local, Rail: its local step follows the previous
    # call's rail step (the local wake-up), and its rail step follows a local step
    rs = _work("reduce_scatter", "hier_rail", 1 << 16)
    assert [w.kind for w in rs] == ["copy", "local", "rail"]
    assert rs[1].after_inter_host and not rs[2].after_inter_host
    # an inter-host step straight after another (Copy steps looked through) is not charged
    assert H._after_inter_host([H.StepWork("rail", rounds=1), H.StepWork("copy")])
    lone = H.StepWork("exchange", rounds=1, recv_bytes=64, after_inter_host=True)
    assert H.step_us(lone, cost, cost.both) == pytest.approx(H.step_us(lone, no_rail, cost.both))

"""The fault soak, short (tilecomm.fault_soak; ``scripts/fault_soak.py`` runs long ones):
ranks killed and stopped at random points, the survivors shrink, a forked newcomer grows the
communicator back, and every call is checked against the references."""

from __future__ import annotations

from tilecomm import fault_soak


def test_a_short_fault_soak_runs_clean(tmp_path):
    # seed 1's plan at 4 ranks: 3 kills, 3 stops, 5 grows in 8 rounds (plan() alone decides)
    res = fault_soak.run(4, 8, 1, timeout=0.5, calls=6, run_dir=str(tmp_path))
    assert not res["wrong"], res["wrong"][:5]
    assert not res["errors"], res["errors"][:3]
    assert res["hangs"] == 0 and res["left_in_shm"] == 0, res
    assert res["rounds"] == 8, res
    assert (res["kills"], res["stops"], res["grows"]) == (3, 3, 5), res
    assert res["calls"] > 0


def test_every_member_draws_the_same_round():
    a = [fault_soak.plan(7, k, 5, 5) for k in range(50)]
    assert a == [fault_soak.plan(7, k, 5, 5) for k in range(50)]
    assert {r.how for r in a if r.victim is not None} == {"kill", "stop"}
    assert all(r.victim is None or 0 <= r.victim < 5 for r in a)
    assert all(0 <= r.at < r.calls for r in a)

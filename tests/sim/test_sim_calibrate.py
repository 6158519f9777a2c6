import os

import pytest

from tilecomm.sim.calibrate import error_table, fit_alpha_beta, fit_launch, validate_published
from tilecomm.sim.measured import Measurement
from tilecomm.sim.nccl import nccl_best, nccl_time
from tilecomm.topology import build, get_preset

CSV = os.path.join(os.path.dirname(__file__), "..", "..", "src", "tilecomm", "sim", "data",
                   "sweeps-calibration.csv")


def test_fit_alpha_beta_recovers_parameters():
    alpha, bw = 12.5, 80.0   # us, GB/s
    rows = [Measurement("all_reduce", "x", 8, s, alpha + s / (bw * 1e3))
            for s in (1 << k for k in range(10, 31, 2))]
    a, b = fit_alpha_beta(rows)
    assert a == pytest.approx(alpha, rel=1e-6) and b == pytest.approx(bw, rel=1e-6)


def test_fit_launch_recovers_overhead():
    spec = get_preset("dgx-a100").with_(launch_us=0.0)
    from tilecomm.sim import best
    rows = [Measurement("all_reduce", "x", 8, s,
                        best("all_reduce", s, system=spec).time_us + 20.0)
            for s in (1024, 4096, 16384)]
    assert fit_launch(spec, rows) == pytest.approx(20.0, abs=0.5)


def test_nccl_model_ring_simple_large():
    t = build("dgx-a100")
    # Ring Simple: busBw = link rate, algBw = busBw * n / (2(n-1))
    s = 1 << 30
    expect = 8.4 + 14 * 3.4 + s / (1000 * 300 * 8 / 14)
    assert nccl_time(t, "all_reduce", s, "ring", "Simple") == pytest.approx(expect)
    assert nccl_best(t, "all_reduce", 1024)[1].endswith("LL")


@pytest.mark.slow
def test_published_accuracy_targets():
    table = error_table(validate_published(CSV))
    assert table["bandwidth"][1] <= 0.10
    assert table["latency"][1] <= 0.25

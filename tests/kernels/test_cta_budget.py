"""The CTA budget (NOTE [CTA budget] in tilecomm.device.budget): for each layout of ranks on
devices, with and without MPS shares and with the setting, the grid every launch gets keeps
all ranks' kernels resident at once; and the launchers (collectives, fused ops) take it."""

from __future__ import annotations

import pytest

from tilecomm.device.budget import CtaBudget, budget_from_rows

H100 = 132


def _rows(layout, sms=H100, pct=None):
    """Rows for ranks on devices: ``layout[r]`` is rank r's device; ``pct[r]`` its MPS share
    (the driver then reports that share of the SMs: ``sms * pct // 100``)."""
    pct = pct or [100] * len(layout)
    return [[sms * p // 100 if p < 100 else sms, dev, p] for dev, p in zip(layout, pct)]


def _fits(layout, budget, sms=H100, pct=None):
    """Every device hosts its ranks' grids at once: the CTAs of the ranks on it (a launch of
    ``budget.ctas``) fit within its SMs."""
    for dev in set(layout):
        on = layout.count(dev)
        if on * budget.ctas > sms:
            return False
    return True


@pytest.mark.parametrize("layout", [[0], [0, 1], [0, 0], [0, 0, 0, 0], [0, 0, 1, 1],
                                    [0] * 8, [0, 0, 0, 1]], ids=str)
def test_without_mps_each_device_is_cut_among_its_ranks(layout):
    b = budget_from_rows(_rows(layout))
    most = max(layout.count(d) for d in set(layout))
    assert b.ctas == H100 // most and b.sharing == most
    assert _fits(layout, b) and b.source == "sms / ranks"


@pytest.mark.parametrize("w", [2, 3, 4, 8])
def test_mps_shares_are_taken_as_reported(w):
    from tilecomm.mps import thread_percentage
    p = thread_percentage(w)
    b = budget_from_rows(_rows([0] * w, pct=[p] * w))
    assert b.ctas == H100 * p // 100 and b.source == "mps share"
    assert _fits([0] * w, b)


def test_oversubscribed_mps_shares_are_scaled_down_until_they_fit():
    # two ranks each told 100% (no share at all) and two told 60%: the reported counts sum
    # past the GPU, so each is scaled by 100 / (sum of shares)
    b = budget_from_rows(_rows([0, 0], pct=[60, 60]))
    assert b.ctas == (H100 * 60 // 100) * 100 // 120
    assert _fits([0, 0], b)


def test_unequal_devices_take_the_smallest_and_the_setting_overrides():
    rows = [[132, 1, 100], [114, 2, 100], [132, 3, 100]]
    assert budget_from_rows(rows).ctas == 114            # every rank launches the same grid
    assert budget_from_rows([[78, 1, 100], [132, 2, 100]]).ctas == 78
    assert budget_from_rows(rows, [0, 0, 0]).ctas == 114
    b = budget_from_rows(rows, [40, 0, 24])              # the smallest value any rank set
    assert (b.ctas, b.source) == (24, "setting")
    assert budget_from_rows([[4, 1, 100]] * 8).ctas == 1  # more ranks than SMs: one each


def test_two_dimensional_grids_stay_within_the_budget():
    b = CtaBudget(16, 8, "sms / ranks")
    assert b.programs(10**9) == 16 and b.programs(5) == 5 and b.programs(0) == 1
    assert b.programs(10**9, width=8) == 2           # a (2, 8) grid: 16 CTAs
    assert b.programs(10**9, width=32) == 1          # never 0
    # the MoE kernels: (programs, W) grids, at most GPU_PROGRAMS = 8 programs
    for w in (2, 4, 8):
        b = budget_from_rows(_rows([0] * w))
        p = min(8, b.programs(10**9, width=w))
        assert p * w * w <= H100 or p == 1           # every rank's (p, W) grid at once


def _launch_grids(comm):
    """The grids of a large all_reduce and of both fused ops under TILECOMM_GPU_CTAS=3, as
    recorded at the interpreter's launch."""
    import torch
    from triton.runtime import interpreter

    from tilecomm.ops import all_gather_matmul, matmul_reduce_scatter
    grids = []
    run = interpreter.InterpretedFunction.run

    def record(self, *args, grid, **kw):
        g = grid(kw) if callable(grid) else grid
        grids.append((self.fn.__name__, tuple(g)))
        return run(self, *args, grid=grid, **kw)

    interpreter.InterpretedFunction.run = record
    try:
        x = torch.ones(40_000)
        comm.all_reduce(x, algo="one_shot")
        a = torch.ones(64, 16)
        b = torch.ones(16, 64)
        all_gather_matmul(a, b, comm)
        matmul_reduce_scatter(torch.ones(64 * comm.world_size, 16), b, comm)
    finally:
        interpreter.InterpretedFunction.run = run
    return grids


@pytest.mark.slow
@pytest.mark.interpreter
def test_launchers_take_the_budget(tmp_path):
    """Collectives and fused ops launch at most the budget's CTAs (here the setting: the
    interpreter's own constant would hide a launcher that ignores it)."""
    import os
    import subprocess
    import sys
    import textwrap
    here = os.path.dirname(os.path.abspath(__file__))
    code = textwrap.dedent(f"""
        import json, os, sys
        sys.path.insert(0, {here!r})
        os.environ["TRITON_INTERPRET"] = "1"
        os.environ["TILECOMM_GPU_CTAS"] = "3"
        import tilecomm
        from test_cta_budget import _launch_grids

        def work(comm):
            comm.use_cpu_kernels("triton")
            return _launch_grids(comm)
        print(json.dumps(tilecomm.launch(work, 2, timeout=60)[0]))
        """)
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    import json
    grids = json.loads(r.stdout.strip().splitlines()[-1])
    names = {n for n, _ in grids}
    assert "one_shot_all_reduce_kernel" in names, names
    assert {"all_gather_matmul_kernel", "matmul_reduce_scatter_kernel"} <= names, names
    for name, g in grids:
        ctas = 1
        for d in g:
            ctas *= d
        assert ctas <= 3, (name, g)
    # the large calls use the whole budget (a launcher stuck at 1 would pass the bound)
    assert max(g[0] for n, g in grids if n == "one_shot_all_reduce_kernel") == 3

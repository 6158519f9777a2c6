"""tilecomm bench kv: the engine against the naive per-block baseline and a memcpy, at a size
small enough for CI (the speed figures live in docs/benchmarks.md, not here)."""

import json

import pytest

from tilecomm.bench.kv import KVBenchConfig, run
from tilecomm.cli import main

SMALL = dict(layers=3, blocks=40, block_size=4, kv_heads=2, head_dim=16, request_blocks=6,
             requests=2, rounds=2)


@pytest.mark.parametrize("fragmented", [False, True])
def test_bench_moves_every_request_exactly_and_counts_its_transfers(fragmented):
    row = run(KVBenchConfig(fragmented=fragmented, **SMALL))
    assert row["wrong"] == 0
    runs = 1 if not fragmented else None
    if runs:    # one run per request: one transfer per (layer, K/V)
        assert row["transfers_per_request"] == 3 * 2
    else:       # random ids: between one run and one per block
        assert 3 * 2 <= row["transfers_per_request"] <= 3 * 2 * 6
    assert row["naive_transfers_per_request"] == 3 * 6
    assert row["request_bytes"] == 3 * 2 * 6 * 4 * 2 * 16 * 2
    # every method per request and pair; every ratio its time over the engine's
    for b in ("naive", "stream", "memcpy", "memcpy_shm"):
        assert row[f"{b}_time_us"] > 0, b
        assert row[f"x_{b}"] == pytest.approx(row[f"{b}_time_us"] / row["time_us"])
        assert row[f"{b}_gbs"] == pytest.approx(row["request_bytes"] / row[f"{b}_time_us"] / 1e3)
    assert row["gbs"] == pytest.approx(row["request_bytes"] / row["time_us"] / 1e3)
    # the first layer lands within the round, which moves ``requests`` requests
    assert row["ttfl_us"] <= row["time_us"] * SMALL["requests"]


def test_bench_rejects_what_cannot_run():
    with pytest.raises(ValueError, match="do not fit"):
        run(KVBenchConfig(**dict(SMALL, requests=10)))
    with pytest.raises(ValueError, match="must be even"):
        run(KVBenchConfig(world_size=3, **SMALL))


def test_cli_prints_the_table_and_writes_json(tmp_path, capsys):
    out = tmp_path / "kv.json"
    rc = main(["bench", "kv", "-n", "2", "--layers", "2", "--blocks", "16", "--block-size", "2",
               "--kv-heads", "1", "--head-dim", "8", "--request-blocks", "4", "--requests", "2",
               "--rounds", "1", "--json", str(out)])
    assert rc == 0
    text = capsys.readouterr().out
    assert "tilecomm kv" in text and "x naive" in text and "x memcpy" in text
    row = json.loads(out.read_text())[0]
    assert row["wrong"] == 0 and row["transfers_per_request"] == 2 * 2
    assert row["bench"] == "kv" and row["case"].startswith("kv/contiguous/layerwise/")

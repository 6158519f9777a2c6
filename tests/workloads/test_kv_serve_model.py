"""``tilecomm model --mode serve`` times the KV transfer from the engine's schedule
(tilecomm.kv.model): the transfer list of tilecomm.kv.schedule, on the system's NICs."""

from __future__ import annotations

import json
import math
import random
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from tilecomm.cli import main
from tilecomm.kv.model import DESCRIPTOR_US, KVLink, block_layout, push_time, request_time
from tilecomm.kv.schedule import CacheGeometry, coalesce, request_bytes, transfers
from tilecomm.topology import get_preset
from tilecomm.workloads.comm import p2p_us
from tilecomm.workloads.inference import infer
from tilecomm.workloads.layout import Layout
from tilecomm.workloads.models import PRESETS

DOCS = Path(__file__).resolve().parents[2] / "docs" / "model.md"
GEO = CacheGeometry(layers=4, blocks=64, block_size=16, kv_heads=2, head_dim=64,
                    dtype=torch.bfloat16)
LINK = KVLink(latency_us=10.0, overhead_us=1.0, GBps=50.0, nics=1)


def _layouts():
    rng = random.Random(7)
    perm = list(range(64))
    rng.shuffle(perm)
    return {
        "contiguous": (list(range(40)), list(range(40))),
        "shifted": (list(range(10, 50)), list(range(3, 43))),
        "reversed": (list(range(40)), list(range(39, -1, -1))),
        "random": (perm[:40], perm[24:]),
        "two runs": ([0, 1, 2, 3, 20, 21], [8, 9, 10, 11, 30, 31]),
        "source gap only": ([0, 1, 2, 5, 6], [0, 1, 2, 3, 4]),
    }


@pytest.mark.parametrize("name", list(_layouts()))
@pytest.mark.parametrize("layers", [None, range(1, 3)])
def test_count_and_bytes_are_the_schedule(name, layers):
    src, dst = _layouts()[name]
    t = push_time(GEO, src, dst, LINK, layers)
    ls = range(GEO.layers) if layers is None else layers
    assert t.transfers_per_push == len(transfers(coalesce(src, dst), ls))
    assert t.bytes_per_push == request_bytes(GEO, len(src), len(ls))


@pytest.mark.parametrize("n, run", [(64, None), (64, 1), (64, 3), (64, 8), (10, 3), (7, 2.5),
                                    (5, 100)])
def test_block_layout_makes_the_runs_it_says(n, run):
    src, dst = block_layout(n, run)
    assert sorted(src) == sorted(dst) == list(range(n))
    runs = coalesce(src, dst)
    assert len(runs) == (1 if run is None else min(n, math.ceil(n / run)))
    lengths = [r.n for r in runs]
    assert max(lengths) - min(lengths) <= 1


def test_time_is_wire_or_posting_bound_exactly():
    contiguous = request_time(GEO, 64, LINK)
    # 8 transfers of 64 blocks x 4 KiB = 256 KiB each, 5.24 us each at 50 GB/s > 1 us posting
    assert contiguous.transfers == 8 and not contiguous.overhead_bound
    assert contiguous.seconds == pytest.approx((10.0 + GEO.nbytes / 50e3) * 1e-6)
    one = request_time(GEO, 64, LINK, run_blocks=1)
    # 512 transfers of 4 KiB (0.08 us on the wire): each costs its 1 us of posting
    assert one.transfers == 512 and one.overhead_bound
    assert one.seconds == pytest.approx((10.0 + 512 * 1.0) * 1e-6)


def test_time_grows_with_fragmentation():
    runs = [None, 32, 8, 4, 2, 1]
    ts = [request_time(GEO, 64, LINK, run_blocks=r) for r in runs]
    counts = [t.transfers for t in ts]
    secs = [t.seconds for t in ts]
    assert counts == sorted(counts) and len(set(counts)) == len(counts)
    assert secs == sorted(secs)
    assert secs[-1] > 5 * secs[0]
    assert all(t.nbytes == ts[0].nbytes for t in ts)     # same bytes, more transfers


def test_time_falls_with_more_nics():
    g = replace(GEO, layers=16)
    one = [request_time(g, 64, replace(LINK, nics=k)).seconds for k in (1, 2, 4, 8)]
    assert all(a > b for a, b in zip(one, one[1:]))
    # 32 equal transfers over 4 NICs: a quarter of the wire time each, plus the latency once
    assert one[2] - 10e-6 == pytest.approx((one[0] - 10e-6) / 4)
    # 8 pushes (8 TP ranks): on 4 NICs two share each, on 8 each has its own
    shared = request_time(g, 64, replace(LINK, nics=4), pushes=8).seconds
    own = request_time(g, 64, replace(LINK, nics=8), pushes=8).seconds
    assert shared - 10e-6 == pytest.approx(2 * (own - 10e-6))
    assert own == pytest.approx(one[0])


def test_link_comes_from_the_system_description():
    spec = get_preset("dgx-h100")
    link = KVLink.from_system("dgx-h100")
    assert link.GBps == spec.nic_GBps and link.nics == spec.nics_per_node
    assert link.overhead_us == DESCRIPTOR_US
    # the simulator's smallest cross-node message costs the link's latency
    assert link.latency_us == pytest.approx(p2p_us(1, "dgx-h100", cross_node=True), abs=1e-3)
    with pytest.raises(ValueError, match="no NICs"):
        KVLink.from_system(spec.with_(nics_per_node=0, nic_GBps=0.0))


def _serve(system="dgx-h100", layout=Layout(tp=8), **kw):
    return infer("llama3-70b", system, layout, batch=8 * layout.dp * layout.pp, prompt=2048,
                 gen=256, mode="serve", **kw)


@pytest.mark.parametrize("run_blocks", [None, 4, 1])
def test_serve_reports_the_schedule_time(run_blocks):
    m = PRESETS["llama3-70b"]
    s = _serve(kv_run_blocks=run_blocks)
    nblocks = 2048 // 16
    # TP 8 over 8 KV heads: 8 ranks push one head each, each over its own NIC
    geo = CacheGeometry(m.layers, nblocks, 16, 1, m.hd, torch.bfloat16)
    want = request_time(geo, nblocks, KVLink.from_system("dgx-h100", nics=8), run_blocks,
                        pushes=8)
    assert s.kv_transfer_s == pytest.approx(want.seconds)
    assert s.breakdown_s["kv_transfer"] == s.kv_transfer_s
    src, dst = block_layout(nblocks, run_blocks)
    assert s.kv_transfers_per_request == 8 * len(transfers(coalesce(src, dst), range(m.layers)))
    assert want.nbytes == s.kv_bytes_per_request          # 2048 tokens fill 128 blocks


def test_serve_fragmented_is_slower_and_pp_splits_layers():
    base = _serve()
    assert _serve(kv_run_blocks=1).kv_transfer_s > 5 * base.kv_transfer_s
    # TP4 PP2: 4 ranks per stage, 2 heads each, 40 layers each: the same bytes per rank
    pp = _serve(layout=Layout(tp=4, pp=2))
    assert pp.kv_transfer_s == pytest.approx(base.kv_transfer_s)
    assert pp.kv_transfers_per_request == base.kv_transfers_per_request // 2


def test_serve_nic_sharing_and_decode_side():
    lat = KVLink.from_system("dgx-h100").latency_us * 1e-6
    base = _serve()
    # decode TP1: each decode rank takes the whole request through its one NIC
    narrow = _serve(decode_layout=Layout(tp=1, dp=8))
    assert narrow.kv_transfer_s - lat == pytest.approx(8 * (base.kv_transfer_s - lat))
    # pcie-8gpu: 8 pushing ranks on 2 NICs of 24.5 GB/s
    pcie = _serve(system="pcie-8gpu")
    wire = 4 * base.kv_bytes_per_request / 8 / 24.5e9
    assert pcie.kv_transfer_s == pytest.approx(wire + lat, rel=1e-3)


def test_cli_kv_flags(capsys):
    argv = ["model", "llama3-70b", "--gpus", "8", "--tp", "8", "--mode", "serve", "--batch",
            "8", "--json"]
    assert main(argv) == 0
    a = json.loads(capsys.readouterr().out)
    assert main(argv + ["--kv-run-blocks", "1", "--kv-block-size", "32"]) == 0
    b = json.loads(capsys.readouterr().out)
    assert a["kv_transfers_per_request"] == 8 * 80 * 2
    assert b["kv_transfers_per_request"] == 8 * 80 * 2 * 64
    assert b["kv_transfer_s"] > a["kv_transfer_s"]
    assert main(argv + ["--kv-run-blocks", "0.5"]) == 2
    assert "run_blocks must be a finite number >= 1" in capsys.readouterr().err


def test_mooncake_rows_in_docs_are_current(tmp_path):
    """The two predictions docs/model.md compares with Mooncake's published figures."""
    p = tmp_path / "mooncake-4x200.json"
    p.write_text(json.dumps({"base": "dgx-a800", "nics_per_node": 4}))
    docs = DOCS.read_text()
    for system, published in ((str(p), 87), ("dgx-h100", 190)):
        r = infer("llama3-70b", system, Layout(tp=8), batch=1, prompt=131072, gen=0,
                  mode="serve")
        gbps = r.kv_bytes_per_request / r.kv_transfer_s / 1e9
        row = f"| {published} GB/s | {gbps:.1f} GB/s | {gbps / published - 1:+.1%} |"
        assert row in docs, f"docs/model.md Mooncake row is stale; expected:\n{row}"

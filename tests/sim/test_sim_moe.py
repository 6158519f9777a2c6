"""`tilecomm sim moe` (tilecomm.sim.moe): the traffic equals what the routing definition sends,
one network crossing per destination host, fp8 row size, the expectation of uniform routing,
monotonicity, the CLI, and the workload model's EP time."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from tilecomm.cli import main
from tilecomm.sim.moe import (expected_traffic, flows, predict_moe, row_bytes, synthetic_topk,
                              traffic_of)


def _independent(topk_by_rank, experts, gpus):
    """Rows per (src, dst rank) and tokens per (src, dst host), counted token by token."""
    w = len(topk_by_rank)
    el = experts // w
    hosts = w // gpus
    counts = np.zeros((w, w))
    host_rows = np.zeros((w, hosts))
    for s, idx in enumerate(topk_by_rank):
        for row in idx.tolist():
            ranks = {e // el for e in row if e >= 0}
            for r in ranks:
                counts[s, r] += 1
            for h in {r // gpus for r in ranks}:
                host_rows[s, h] += 1
    return counts, host_rows


def test_traffic_is_what_the_routing_sends():
    w, gpus, experts = 4, 2, 8
    host_of = [r // gpus for r in range(w)]
    idx = synthetic_topk(w, 50, 3, experts, seed=3, host_of=host_of)
    tr = traffic_of(idx, experts, host_of)
    counts, host_rows = _independent(idx, experts, gpus)
    np.testing.assert_array_equal(tr.counts, counts)
    np.testing.assert_array_equal(tr.host_rows, host_rows)
    assert tr.selections.sum() == w * 50 * 3
    # the bytes per (src, dst) pair of dispatch, from the counts, independently
    rb = 10
    got = flows(tr, gpus, "dispatch", "normal", rb)
    want: dict = {}
    for s in range(w):
        for r in range(w):
            if s // gpus == r // gpus:
                want[(s, r)] = want.get((s, r), 0) + counts[s, r] * rb
            else:
                p = (r // gpus) * gpus + s % gpus          # s's rail partner on r's host
                want[(p, r)] = want.get((p, r), 0) + counts[s, r] * rb
        for h in range(w // gpus):
            if h != s // gpus:
                p = h * gpus + s % gpus
                want[(s, p)] = want.get((s, p), 0) + host_rows[s, h] * rb
    assert got == {k: v for k, v in want.items() if v > 0}
    # combine is the same pairs reversed
    back = flows(tr, gpus, "combine", "normal", rb)
    assert back == {(b, a): v for (a, b), v in got.items()}


def test_one_crossing_per_destination_host():
    # 2 hosts x 4 ranks, 8 experts (1 per rank); token 0 of rank 0 picks experts on ranks
    # 4, 5, 6 (all on host 1): it crosses once, to rank 4 (rank 0's partner), then fans out
    w, gpus, experts = 8, 4, 8
    host_of = [r // gpus for r in range(w)]
    idx = [torch.tensor([[4, 5, 6]])] + [torch.tensor([[r, -1, -1]]) for r in range(1, w)]
    tr = traffic_of(idx, experts, host_of)
    assert tr.host_rows[0].tolist() == [0, 1]
    fl = flows(tr, gpus, "dispatch", "normal", 1)
    crossings = {k: v for k, v in fl.items() if k[0] // gpus != k[1] // gpus}
    assert crossings == {(0, 4): 1}
    assert fl[(4, 5)] == fl[(4, 6)] == 1 and fl[(4, 4)] == 2   # 4's own row + the forward
    # low-latency mode: one message per (token, expert), no de-duplication
    ll = flows(tr, gpus, "dispatch", "low_latency", 1)
    assert ll[(0, 4)] == ll[(0, 5)] == ll[(0, 6)] == 1


def test_row_bytes():
    assert row_bytes(7168) == 14336
    assert row_bytes(7168, fp8=True) == 7168 + 56 * 4 == 7392      # DeepEP: (1 + 4/128) * h
    assert row_bytes(100, fp8=True) == 100 + 4                      # a partial block: 1 scale


def test_expected_traffic_matches_a_large_sample():
    w, gpus, experts, k, t = 8, 4, 32, 4, 4000
    host_of = [r // gpus for r in range(w)]
    tr = traffic_of(synthetic_topk(w, t, k, experts, seed=1), experts, host_of)
    ex = expected_traffic(w, gpus, t, k, experts)
    assert tr.counts.mean() == pytest.approx(ex.counts.mean(), rel=0.02)
    assert tr.host_rows.mean() == pytest.approx(ex.host_rows.mean(), rel=0.02)
    assert tr.selections.mean() == pytest.approx(ex.selections.mean())


def test_node_limited_and_skewed_routing():
    w, gpus, experts = 16, 4, 64
    host_of = [r // gpus for r in range(w)]
    idx = synthetic_topk(w, 200, 8, experts, seed=2, topk_groups=2, host_of=host_of)
    for t in idx:      # 16 experts per host: at most 2 hosts per token, 8 distinct experts
        assert all(len(set((row // 16).tolist())) <= 2 for row in t)
        assert all(len(set(row.tolist())) == 8 for row in t)
    hot = synthetic_topk(w, 200, 2, experts, seed=2, skew=1.5)
    per_expert = torch.bincount(torch.cat(hot).flatten(), minlength=experts)
    assert per_expert.max() > 4 * per_expert.float().mean()


def test_more_tokens_take_longer_and_fp8_is_faster():
    kw = dict(system="dgx-h800", hidden=1024, topk=4, experts=32)
    small = predict_moe(tokens=128, **kw)
    big = predict_moe(tokens=1024, **kw)
    assert big.dispatch.time_us > small.dispatch.time_us
    assert big.combine.time_us > small.combine.time_us
    fp8 = predict_moe(tokens=1024, fp8=True, **kw)
    assert fp8.dispatch.time_us < big.dispatch.time_us
    assert fp8.combine.time_us == pytest.approx(big.combine.time_us)   # combine is bf16 back
    two = predict_moe(tokens=1024, nodes=2, **kw)
    assert two.dispatch.counted_as == "RDMA" and big.dispatch.counted_as == "NVL"
    assert two.dispatch.bottleneck.startswith(("nic", "gpu"))
    # the counted bytes and GB/s are consistent
    d = big.dispatch
    assert d.GBps == pytest.approx(d.counted_bytes / (d.time_us * 1e3))
    assert d.time_us > d.fixed_us > 0


def test_cli_runs_and_writes_json(tmp_path, capsys):
    out = tmp_path / "moe.json"
    rc = main(["sim", "moe", "--system", "dgx-h100", "--nodes", "2", "--tokens", "256",
               "--hidden", "1024", "--topk", "4", "--experts", "32", "--fp8", "--json",
               str(out)])
    assert rc == 0
    text = capsys.readouterr().out
    assert "dispatch" in text and "combine" in text and "RDMA" in text
    d = json.loads(out.read_text())
    assert d["world"] == 16 and d["fp8"] and d["mode"] == "normal"
    for ph in ("dispatch", "combine"):
        assert d[ph]["time_us"] > 0 and d[ph]["GBps"] > 0 and d[ph]["bottleneck"]
    rc = main(["sim", "moe", "--system", "dgx-h100", "--tokens", "64", "--hidden", "512",
               "--topk", "2", "--experts", "16", "--mode", "low_latency"])
    assert rc == 0 and "LL" in capsys.readouterr().out


def test_workload_model_charges_dispatch_and_combine():
    from tilecomm.workloads.comm import Placement, moe_us
    d, c, sent = moe_us(1024, 1024, 2, 4, 32, "dgx-h100", Placement(8, 1, 8))
    p = predict_moe("dgx-h100", tokens=1024, hidden=1024, topk=4, experts=32, expected=True,
                    engine="phases")
    assert d == pytest.approx(p.dispatch.time_us) and c == pytest.approx(p.combine.time_us)
    assert sent == pytest.approx(expected_traffic(8, 8, 1024, 4, 32).counts[0].sum() * 2048)
    # between grid points: interpolated, and monotone
    d2, _, _ = moe_us(1536, 1024, 2, 4, 32, "dgx-h100", Placement(8, 1, 8))
    d3, _, _ = moe_us(2048, 1024, 2, 4, 32, "dgx-h100", Placement(8, 1, 8))
    assert d < d2 < d3

"""What a KV transfer moves (tilecomm.kv.schedule): runs, transfers, checks, the reference."""

import pytest
import torch

from tilecomm.kv import CacheGeometry, Run, coalesce, reference_transfer, transfers
from tilecomm.kv.schedule import check_block_ids, request_bytes


def test_runs_break_where_either_side_breaks():
    assert coalesce([0, 1, 2, 3], [5, 6, 7, 8]) == [Run(0, 5, 4)]
    assert coalesce([0, 1, 2, 3], [5, 6, 9, 10]) == [Run(0, 5, 2), Run(2, 9, 2)]
    assert coalesce([0, 1, 4, 5], [5, 6, 7, 8]) == [Run(0, 5, 2), Run(4, 7, 2)]
    assert coalesce([3, 2, 1], [0, 1, 2]) == [Run(3, 0, 1), Run(2, 1, 1), Run(1, 2, 1)]
    with pytest.raises(ValueError, match="3 source blocks for 2"):
        coalesce([0, 1, 2], [0, 1])


def test_transfers_are_layer_major_k_then_v():
    runs = [Run(0, 4, 2), Run(7, 1, 1)]
    got = [(t.layer, t.kv, t.run) for t in transfers(runs, range(1, 3))]
    assert got == [(1, 0, runs[0]), (1, 0, runs[1]), (1, 1, runs[0]), (1, 1, runs[1]),
                   (2, 0, runs[0]), (2, 0, runs[1]), (2, 1, runs[0]), (2, 1, runs[1])]


def test_moving_the_runs_equals_the_block_by_block_reference():
    g = torch.Generator().manual_seed(3)
    src = torch.randn(3, 2, 10, 4, 2, 8, generator=g).to(torch.bfloat16)
    dst = torch.randn(3, 2, 10, 4, 2, 8, generator=g).to(torch.bfloat16)
    s_ids, d_ids = [0, 1, 2, 7, 8, 4], [3, 4, 5, 0, 1, 9]
    want = reference_transfer(src, dst, s_ids, d_ids)
    got = dst.clone()
    for t in transfers(coalesce(s_ids, d_ids), range(3)):
        r = t.run
        got[t.layer, t.kv, r.dst:r.dst + r.n] = src[t.layer, t.kv, r.src:r.src + r.n]
    assert torch.equal(got.view(torch.int16), want.view(torch.int16))
    assert len(coalesce(s_ids, d_ids)) == 3


def test_block_ids_are_checked_with_the_offending_id_named():
    g = CacheGeometry(2, 8, 4, 2, 8, torch.bfloat16)
    assert check_block_ids(torch.tensor([3, 1]), g, "x") == [3, 1]
    for bad, text in (([8], "block id 8 .position 0. is out of range"),
                      ([1, -1], "block id -1"), ([2, 2], "appears twice"), ([], "empty"),
                      ([1.5], "ints"), (torch.tensor([1.0]), "integer tensor")):
        with pytest.raises(ValueError, match=text):
            check_block_ids(bad, g, "x")


def test_geometry_round_trips_and_sizes():
    g = CacheGeometry(32, 1024, 16, 8, 128, torch.bfloat16)
    assert CacheGeometry.from_words(g.words()) == g
    assert g.block_bytes == 16 * 8 * 128 * 2
    assert request_bytes(g, 64) == 32 * 2 * 64 * g.block_bytes
    assert request_bytes(g, 64, heads=4) == request_bytes(g, 64) // 2
    with pytest.raises(ValueError, match="kv_heads must be a positive int"):
        CacheGeometry(2, 8, 4, 0, 8, torch.bfloat16)

"""The KV transfer engine inside one host (ranks from tilecomm.launch, shared memory): every
scenario of kv_scenarios.py, bit for bit against the block-by-block reference."""

import sys
from pathlib import Path

import pytest
import torch
from shm_files import tilecomm_files

import tilecomm
import tilecomm.kv

sys.path.insert(0, str(Path(__file__).resolve().parent))
import kv_scenarios as S  # noqa: E402


@pytest.fixture(autouse=True)
def no_shm_left():
    before = tilecomm_files()
    yield
    assert tilecomm_files() <= before


@pytest.mark.parametrize("world", [2, 4])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_many_requests_in_flight_land_exactly(world, dtype):
    out = tilecomm.launch(S.many_requests, world, dtype, timeout=60)
    pre, dec = S.roles(world)
    for d in dec:
        # 3 blocks (dst drawn from a shuffled pool) and 4 fragmented blocks, 3 layers, K and V
        assert len(out[d]) == 2 * len(pre)
        assert all(6 <= t <= 3 * 2 * 4 for t in out[d].values()), out[d]


def test_contiguous_blocks_move_as_one_transfer_per_layer_and_kv():
    def run(comm):
        kv = tilecomm.kv.KVTransfer(comm)
        kv.paged_cache(kv_heads=2, **S.GEO)
        if comm.rank == 1:
            h = kv.expect("c", src=0, block_ids=list(range(8, 16)))
            h.wait()
            out = h.transfers
        else:
            out = kv.push("c", dst=1, block_ids=list(range(0, 8))).transfers
        kv.close()
        return out
    assert tilecomm.launch(run, 2) == [3 * 2, 3 * 2]


def test_a_layer_is_ready_as_soon_as_it_has_landed():
    seen = tilecomm.launch(S.layer_by_layer, 2)[1]
    assert seen == [[True, False, False], [True, True, False], [True, True, True]]


def test_heads_gathered_from_two_prefill_ranks():
    tilecomm.launch(S.head_split_gather, 3)


def test_heads_scattered_to_two_decode_ranks():
    tilecomm.launch(S.head_split_scatter, 3)


def test_every_rank_sends_and_receives_at_once():
    assert tilecomm.launch(S.all_pairs, 3) == [2 * 3 * 2 * 2] * 3


@pytest.mark.slow
def test_bad_input_raises_on_both_sides():
    p, d = tilecomm.launch(S.errors, 2)
    assert set(p) == {"count", "range", "mine", "bad_dst", "layers", "heads", "unknown",
                      "cancelled"}
    assert set(d) == {"count", "range", "mine", "unknown", "silent"}


def test_caches_that_cannot_exchange_are_refused_on_both_sides():
    p, d = tilecomm.launch(S.geometry_mismatch, 2)
    assert "head_dim" in p["p"] and "head_dim" in d["d"]


def test_calls_before_the_cache_and_after_close_are_refused():
    def run(comm):
        kv = tilecomm.kv.KVTransfer(comm)
        with pytest.raises(ValueError, match="paged_cache"):
            kv.expect("a", src=1 - comm.rank, block_ids=[0])
        kv.paged_cache(kv_heads=1, **S.GEO)
        with pytest.raises(ValueError, match="already has its cache"):
            kv.paged_cache(kv_heads=1, **S.GEO)
        with pytest.raises(ValueError, match="device .meta. is not supported"):
            tilecomm.kv.KVTransfer(comm).paged_cache(kv_heads=1, device="meta", **S.GEO)
        with pytest.raises(ValueError, match="request_id"):
            kv.push(3.5, dst=1 - comm.rank, block_ids=[0])
        kv.close()
        with pytest.raises(tilecomm.CommError, match="closed"):
            kv.poll()
    tilecomm.launch(run, 2)


@pytest.mark.slow
def test_retries_duplicates_and_a_failed_request_with_two_senders():
    r0, r1, r2 = tilecomm.launch(S.retries_and_failures, 3)
    assert r2["g_blocks_untouched"], "a sender wrote into a request that had failed"
    assert r2["expect_s"] < 0.4, r2     # 5 expects into a 2-slot ring, sender busy for 0.5 s
    assert "gave up" in r1["g"] and "expects 2" in r0["g"]


def test_the_heap_stays_in_step_after_close():
    assert tilecomm.launch(S.heap_after_close, 2) == [1, 1]


def test_close_with_a_request_in_flight_refuses_its_later_push():
    def run(comm):
        kv = tilecomm.kv.KVTransfer(comm, timeout=5)
        cache = kv.paged_cache(kv_heads=1, **S.GEO)
        out = None
        if comm.rank == 1:
            kv.expect("late", src=0, block_ids=[3])
            kv.close()
            comm.barrier()
            out = bool((cache == 0).all())
        else:
            cache.fill_(1.0)
            comm.barrier()
            with pytest.raises(tilecomm.CommMismatch, match="closed its KVTransfer"):
                kv.push("late", dst=1, block_ids=[0])
            kv.close()
        return out
    assert tilecomm.launch(run, 2)[1] is True

"""Bad calls through the torch backend fail with errors that name the collective, on every rank."""

from __future__ import annotations

import pytest

import time

import torch
import torch.distributed as dist

from .harness import run_ranks


def _catch(fn):
    try:
        fn()
    except Exception as e:  # noqa: BLE001 - the test inspects it
        return f"{type(e).__name__}: {e}"
    return "no error"


def _unsupported(rank, w):
    out = {}
    out["meta"] = _catch(lambda: dist.all_reduce(torch.empty(3, device="meta")))
    out["premul"] = _catch(lambda: dist.all_reduce(
        torch.ones(2), op=dist._make_nccl_premul_sum(2.0)))
    out["band_float"] = _catch(lambda: dist.all_reduce(torch.ones(2), op=dist.ReduceOp.BAND))
    out["avg_int"] = _catch(lambda: dist.all_reduce(torch.ones(2, dtype=torch.int32),
                                                    op=dist.ReduceOp.AVG))
    t = torch.ones(2)
    dist.all_reduce(t)           # the group still works after refused calls on every rank
    out["after"] = t.tolist()
    return out


def test_unsupported_combinations_name_the_collective_and_reason():
    for out in run_ranks(_unsupported, 2):
        assert isinstance(out, dict), out
        assert "all_reduce on a meta tensor is not supported" in out["meta"]
        assert "PREMUL_SUM is not supported" in out["premul"]
        assert "BAND needs an integer or bool tensor" in out["band_float"]
        assert "AVG needs a floating-point tensor" in out["avg_int"]
        assert "No backend type associated" not in str(out)
        assert out["after"] == [2.0, 2.0]


def _one_rank_bad(rank, w):
    outs = [torch.zeros(2) for _ in range(w if rank else w + 1)]   # rank 0: one too many
    err = _catch(lambda: dist.all_gather(outs, torch.ones(2)))
    return err


def test_bad_argument_on_one_rank_fails_every_rank():
    t0 = time.monotonic()
    res = run_ranks(_one_rank_bad, 3, timeout=20)
    assert time.monotonic() - t0 < 15          # the peers learn of it, they do not time out
    assert res[0].startswith("ValueError") and "all_gather: output list has 4" in res[0]
    for r in (1, 2):
        assert res[r].startswith("CommError") and "rank 0" in res[r], res[r]


def _skip_call(rank, w):
    if rank == 1:
        time.sleep(3)
        return "skipped"
    t0 = time.monotonic()
    err = _catch(lambda: dist.all_reduce(torch.ones(4)))
    return err, time.monotonic() - t0


@pytest.mark.slow
def test_missing_rank_times_out_with_the_group_timeout():
    res = run_ranks(_skip_call, 2, timeout=1.0)
    err, waited = res[0]
    assert err.startswith("CommTimeout"), err
    assert "all_reduce" in err and "#1" in err and "1" in err
    assert waited < 10

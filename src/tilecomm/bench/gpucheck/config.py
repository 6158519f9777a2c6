"""What the GPU check runs: the configuration of a GPU run and of the CPU dry run.

One dict (it travels to the rank processes and into ``gpu_check.json``); :func:`config` gives
the defaults, the command line and tests change entries. Sizes are bytes of the largest
buffer of a call (nccl-tests' size column, as ``tilecomm bench``).
"""

from __future__ import annotations


def _sweep(lo: int, hi: int, factor: int) -> list[int]:
    out, n = [], lo
    while n <= hi:
        out.append(n)
        n *= factor
    if out[-1] != hi:
        out.append(hi)
    return out


def config(interpret: bool) -> dict:
    """The defaults: ``interpret`` is the CPU dry run (Triton interpreter, CPU ranks, small
    sizes); otherwise one GPU machine, 2 and 4 ranks sharing ``cuda:0``."""
    if interpret:
        return dict(
            interpret=True, worlds=[[2, "cpu"]], budget=600.0, device_timeout=5.0,
            # correctness
            check_sizes=[8, 148], full_sizes=[148], plan_sizes=[148], mix_mems=True,
            cover=True, bits_sizes=[600], seq_len=6,
            # timing: the per-algorithm table and the sweep of auto (eager and graph)
            time_sizes=[1024], sweep_sizes=[8, 4096], sweep_ops=["all_reduce", "all_gather"],
            iters=2, rounds=2, warmup=1, copy_bytes=8 << 20, latency_iters=3,
            # moe and the fused ops
            moe_cases="interpret", moe_iters=0,
            overlap_check_shapes=[[5, 24, 20]], overlap_dtypes=["float32", "bfloat16"],
            overlap_time_shapes=[[8, 16, 16]], overlap_time_dtype="float32",
            overlap_iters=1, overlap_rounds=2,
            profile=False, mps="off")
    return dict(
        interpret=False, worlds=[[2, "cuda:0"], [4, "cuda:0"]], budget=390.0,
        device_timeout=5.0,
        check_sizes=[4, 4012, 262164, 4 << 20], full_sizes=[4012, 262164],
        plan_sizes=[4012, 262164], mix_mems=False, cover=False,
        bits_sizes=[4012, 262164], seq_len=24,
        time_sizes=[8 << 10, 1 << 20, 16 << 20], sweep_sizes=_sweep(8, 256 << 20, 8),
        sweep_ops=["all_reduce", "all_gather", "reduce_scatter", "broadcast", "reduce",
                   "all_to_all"],
        iters=20, rounds=5, warmup=3, copy_bytes=256 << 20, latency_iters=200,
        moe_cases="gpu", moe_iters=10,
        # fused ops: m rows per rank, K, N (4 ranks x 512 rows = a 2048-token TP GEMM)
        overlap_check_shapes=[[300, 256, 200]], overlap_dtypes=["float32", "bfloat16"],
        overlap_time_shapes=[[512, 4096, 4096], [128, 8192, 8192]],
        overlap_time_dtype="bfloat16", overlap_iters=5, overlap_rounds=3,
        profile=True, mps="auto")

"""dist.all_reduce and a DDP step through the tilecomm torch.distributed backend vs Gloo.

Stays a script (its timing is the bench harness's, ``tilecomm.bench.timing``): each backend
needs processes of its own that torch.distributed initializes with it (``tilecomm bench`` ranks
hold a Communicator and Gloo side by side), and the DDP step runs under torchrun.

    python benchmarks/torch_backend.py -n 2 -b 8 -e 64M -f 4 --json benchmarks/results/torch_backend_2ranks.json

Both backends run in the same invocation, one after the other, with the same sizes: each
size is warmed up, then timed in ``--rounds`` rounds of back-to-back calls (separated by a
barrier); the reported time is the median over rounds of the slowest rank's. The DDP step is
``examples/ddp_train.py`` under torchrun (median step of ``--ddp-steps``). The last column
times tilecomm's Communicator called directly in the same processes, interleaved round by
round with dist.all_reduce: the difference is the cost of going through torch.distributed.
``x gloo`` = Gloo's time / tilecomm's (above 1: tilecomm is faster).
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from tilecomm.units import format_size, parse_size, sizes  # noqa: E402


def _method(call, t, iters: int, chunk: int | None):
    """The harness's method: ``iters`` back-to-back ``call(t)`` per round, ``t`` re-filled
    with ones (untimed) before the sums could overflow."""
    return lambda tm: tm.calls("call", lambda: call(t), iters, refill=lambda: t.fill_(1),
                               chunk=chunk, warmup=3)


def _rank(rank, world, backend, path, byte_sizes, rounds, q):
    import torch
    import torch.distributed as dist

    import tilecomm  # noqa: F401 - registers the backend

    torch.set_num_threads(1)
    dist.init_process_group(backend, init_method=f"file://{path}", rank=rank, world_size=world)
    # tilecomm's group also times its Communicator directly: the cost of the torch layer.
    from tilecomm.bench.runner import safe_chunk
    from tilecomm.bench.timing import measure

    comm = getattr(dist.group.WORLD, "comm", None)
    calls = {"dist": dist.all_reduce}
    if comm is not None:
        calls["comm"] = comm.all_reduce
    chunk = safe_chunk("all_reduce", torch.float32, world)
    rows = []
    for nbytes in byte_sizes:
        t = torch.ones(max(1, nbytes // 4))
        iters = max(5, min(1000, int(2e7 // max(nbytes, 1))))
        methods = {name: _method(call, t, iters, chunk) for name, call in calls.items()}
        rows.append(measure(dist.barrier, methods, rounds))
    dist.destroy_process_group()
    q.put((rank, rows))


def time_all_reduce(backend: str, world: int, byte_sizes: list[int], rounds: int) -> list:
    """Seconds per dist.all_reduce (the median round of the slowest rank) for each size: one
    list per size, ``[dist.all_reduce]`` or, for tilecomm, ``[dist.all_reduce,
    comm.all_reduce]``."""
    from tilecomm.bench.harness import method_stats

    ctx = mp.get_context("fork")
    q = ctx.Queue()
    fd, path = tempfile.mkstemp(prefix="tilecomm-bench-")
    os.close(fd)
    os.unlink(path)
    procs = [ctx.Process(target=_rank, args=(r, world, backend, path, byte_sizes, rounds, q))
             for r in range(world)]
    for p in procs:
        p.start()
    try:
        per_rank = [q.get(timeout=1800)[1] for _ in procs]
    finally:
        for p in procs:
            p.join(timeout=10)
            if p.is_alive():
                p.kill()
        if os.path.exists(path):
            os.unlink(path)
    return [[method_stats([r[i][m] for r in per_rank]).median_s for m in per_rank[0][i]]
            for i in range(len(byte_sizes))]


def ddp_step_ms(backend: str, world: int, steps: int, hidden: int) -> float:
    with tempfile.TemporaryDirectory() as d:
        out = Path(d) / "losses.json"
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone",
               "--nproc-per-node", str(world), str(ROOT / "examples" / "ddp_train.py"),
               "--backend", backend, "--steps", str(steps), "--hidden", str(hidden),
               "--losses", str(out)]
        for attempt in (1, 2):
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=1800,
                                  env=dict(os.environ, OMP_NUM_THREADS="1"))
            if proc.returncode == 0:
                return json.loads(out.read_text())["step_ms"]
            # Gloo's ranks occasionally abort (SIGABRT) here; say so and try once more.
            print(f"DDP run on {backend} failed (attempt {attempt}, exit {proc.returncode}): "
                  f"{proc.stderr.strip().splitlines()[-1] if proc.stderr.strip() else ''}")
        raise RuntimeError(f"DDP run on {backend} failed twice")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-n", "--world-size", type=int, default=2)
    ap.add_argument("-b", "--minbytes", default="8")
    ap.add_argument("-e", "--maxbytes", default="64M")
    ap.add_argument("-f", "--stepfactor", type=int, default=4)
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--ddp-steps", type=int, default=60)
    ap.add_argument("--ddp-hidden", type=int, nargs="+", default=[256, 1024])
    ap.add_argument("--json", help="write the results here")
    args = ap.parse_args()

    byte_sizes = sizes(parse_size(args.minbytes), parse_size(args.maxbytes), args.stepfactor)
    ours = time_all_reduce("tilecomm", args.world_size, byte_sizes, args.rounds)
    gloo = time_all_reduce("gloo", args.world_size, byte_sizes, args.rounds)
    print(f"# dist.all_reduce float32 sum, {args.world_size} ranks, median of {args.rounds} "
          f"rounds, slowest rank")
    print(f"{'size':>8} {'tilecomm us':>12} {'gloo us':>10} {'x gloo':>8} "
          f"{'Communicator us':>16}")
    rows = []
    for nbytes, (a, direct), (b,) in zip(byte_sizes, ours, gloo):
        print(f"{format_size(nbytes):>8} {a * 1e6:12.1f} {b * 1e6:10.1f} {b / a:7.2f}x "
              f"{direct * 1e6:16.1f}")
        rows.append({"bytes": nbytes, "tilecomm_us": a * 1e6, "gloo_us": b * 1e6,
                     "communicator_us": direct * 1e6})
    ddp = []
    for hidden in args.ddp_hidden:
        a = ddp_step_ms("tilecomm", args.world_size, args.ddp_steps, hidden)
        b = ddp_step_ms("gloo", args.world_size, args.ddp_steps, hidden)
        params = 64 * hidden + hidden + hidden * hidden + hidden + hidden + 1
        print(f"DDP step, hidden {hidden} ({params / 1e6:.2f} M params): tilecomm {a:.2f} ms, "
              f"gloo {b:.2f} ms, {b / a:.2f}x")
        ddp.append({"hidden": hidden, "params": params, "tilecomm_ms": a, "gloo_ms": b})
    if args.json:
        Path(args.json).write_text(json.dumps({"world_size": args.world_size,
                                               "all_reduce": rows, "ddp": ddp}, indent=1))


if __name__ == "__main__":
    main()

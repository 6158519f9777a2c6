"""Phase ``profile`` (parent side, last, after MPS is stopped): the hottest kernels under Nsight
Compute, so that the next change is chosen from a profile rather than a guess.

Two rank processes meet through a file store (``tilecomm.launch.connect``); rank 0 runs under
``ncu`` (``--clock-control none``: the clocks are left alone), rank 1 does not: Nsight Compute
serializes the kernel launches of the processes it profiles and does not support MPS clients,
so a profiled peer would wait for a kernel that never starts. Per kernel (one_shot and
two_shot all_reduce, all_gather direct, MoE dispatch): duration, DRAM throughput as % of
peak and achieved occupancy, kept raw in ``profile_ncu.csv``.

Only metrics one pass collects: for more passes ncu replays a kernel after restoring its
memory, which rolls back the signals the unprofiled peer wrote once, so the replay would wait
for them until the device timeout. Warp stall reasons need such passes; they are not taken.

    python -m tilecomm.bench.gpucheck.profile --rank 1 --world 2 --store FILE   # a rank
"""

from __future__ import annotations

import argparse
import csv
import io
import os
import subprocess
import sys
import time

#: the kernels profiled (a regular expression over Triton's kernel names)
KERNELS = "one_shot_all_reduce|two_shot_all_reduce|all_gather_direct|moe_dispatch_push"
DRAM = "dram__throughput.avg.pct_of_peak_sustained_elapsed"
OCCUPANCY = "sm__warps_active.avg.pct_of_peak_sustained_active"
DURATION = "gpu__time_duration.sum"
#: collected in one pass (no replay: see the module docstring)
METRICS = (DURATION, DRAM, OCCUPANCY)


def workload(rank: int, world: int, store_path: str) -> None:
    """What both ranks run: a few calls of each profiled kernel, warm first."""
    import torch
    import torch.distributed as dist

    from tilecomm.launch import connect
    from tilecomm.moe import ExpertParallel, routing

    torch.cuda.set_device(0)
    comm = connect(dist.FileStore(store_path, world), rank, world, timeout=120)
    x = comm.alloc((1 << 20,), torch.float32, device="cuda")        # 4 MiB heap tensor
    big = comm.alloc((4 << 20,), torch.float32, device="cuda")      # 16 MiB
    out = comm.alloc((4 << 20,), torch.float32, device="cuda")
    g = torch.Generator().manual_seed(rank)
    tok = torch.randn(256, 7168, generator=g).to(torch.bfloat16).cuda()
    idx = routing.random_topk(256, 8, 8 * world, generator=g, drop=0.0).cuda()
    wts = torch.rand(256, 8, generator=g).cuda()
    ep = ExpertParallel(comm, num_experts=8 * world, hidden=7168, dtype=torch.bfloat16)
    for _ in range(3):
        x.fill_(1)
        big.fill_(1)
        comm.all_reduce(x, "avg", algo="one_shot")
        comm.all_reduce(big, "avg", algo="two_shot")
        comm.all_gather(big[: big.numel() // world], out, algo="direct")
        ep.dispatch(tok, idx, wts)
        comm.synchronize()
    comm.barrier()
    comm.close()


def parse(text: str) -> list[dict]:
    """Per profiled kernel (``ncu --csv --page raw``): name, duration, DRAM %, occupancy %."""
    rows = list(csv.reader(io.StringIO(text)))
    head = next((i for i, r in enumerate(rows) if "Kernel Name" in r), None)
    if head is None:
        return []
    cols = rows[head]
    out = []
    for r in rows[head + 2:]:               # the row after the header holds the units
        if len(r) != len(cols):
            continue
        d = dict(zip(cols, r))
        out.append({"kernel": d.get("Kernel Name", "?")[:60], "duration": d.get(DURATION),
                    "dram_pct": d.get(DRAM), "occupancy_pct": d.get(OCCUPANCY)})
    return out


def run(cfg: dict, ncu: str | None, out_dir: str, budget_s: float, work_dir: str,
        log=print) -> dict:
    """The phase: ``{"status": ..., "kernels": [...]}`` (never raises)."""
    if cfg["interpret"] or not cfg.get("profile"):
        return dict(status="n/a: no GPU (interpret mode)" if cfg["interpret"] else "off")
    if not ncu:
        return dict(status="n/a: ncu (Nsight Compute) not found")
    if budget_s < 20:
        return dict(status=f"skipped: {budget_s:.0f} s left")
    store = os.path.join(work_dir, "profile.store")
    csv_path = os.path.join(out_dir, "profile_ncu.csv")
    env = dict(os.environ, TILECOMM_DEVICE_TIMEOUT="20", PYTHONUNBUFFERED="1")
    me = [sys.executable, "-m", __name__, "--world", "2", "--store", store]
    cmd0 = [ncu, "--target-processes", "application-only", "--clock-control", "none",
            "--cache-control", "none", "--kernel-name", f"regex:{KERNELS}",
            "--launch-skip", "4", "--launch-count", "8", "--metrics", ",".join(METRICS),
            "--csv", "--page", "raw", *me, "--rank", "0"]
    t0 = time.time()
    p0 = subprocess.Popen(cmd0, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                          env=env)
    peer_log = open(os.path.join(work_dir, "profile_peer.log"), "w")   # never a full pipe
    p1 = subprocess.Popen(me + ["--rank", "1"], stdout=peer_log, stderr=peer_log, env=env)
    status = "ok"
    try:
        out0, err0 = p0.communicate(timeout=budget_s)
        p1.wait(timeout=max(5.0, budget_s - (time.time() - t0)))
    except subprocess.TimeoutExpired:
        status = f"timed out after {budget_s:.0f} s"
        for p in (p0, p1):
            p.terminate()
        for p in (p0, p1):
            try:
                p.wait(timeout=15)
            except subprocess.TimeoutExpired:
                p.kill()
        out0, err0 = (p0.stdout.read() if p0.stdout else ""), ""
    peer_log.close()
    with open(csv_path, "w") as f:
        f.write(out0 or "")
    kernels = parse(out0 or "")
    if status == "ok" and (p0.returncode or p1.returncode):
        with open(os.path.join(work_dir, "profile_peer.log"), errors="replace") as f:
            peer = f.read().strip()[-300:]
        status = f"ncu rank exited {p0.returncode}, peer {p1.returncode}: " \
                 f"{(err0 or '').strip()[-300:]} | peer: {peer}"
    if status == "ok" and not kernels:
        status = "no kernel profiled: " + (err0 or "").strip()[-300:]
    log(f"[gpu_check] profile: {status} ({len(kernels)} kernels, {time.time() - t0:.0f} s)")
    return dict(status=status, kernels=kernels, csv=os.path.basename(csv_path),
                caveat="one pass per kernel (a replay would wait for signals the peer wrote "
                       "once); the duration includes waiting for the peer",
                seconds=round(time.time() - t0, 1))


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description="one rank of the profile phase's workload")
    p.add_argument("--rank", type=int, required=True)
    p.add_argument("--world", type=int, default=2)
    p.add_argument("--store", required=True)
    a = p.parse_args(argv)
    workload(a.rank, a.world, a.store)
    return 0


if __name__ == "__main__":
    sys.exit(main())

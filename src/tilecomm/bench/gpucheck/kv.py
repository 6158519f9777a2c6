"""Phase ``kv``: the KV-cache transfer engine (``tilecomm.kv``) on caches in the device heap.

Ranks pair up, even rank prefill, the next one decode (2 ranks: one pair; 4: two at once).

Checks, bit for bit against ``tilecomm.kv.reference_transfer`` of the sender's seeded data:
both copy paths (``kernel``, ``copy_engine``), bf16 and fp8 e4m3 caches, fragmented block
ids, a head split (4 heads prefill, 2 decode), pushed layer by layer; on CUDA the receiver
waits for every layer on the device (``ExpectHandle.wait_on_device``) before the host wait,
and each push must report the path it was asked for.

Timings (slowest rank, median of rounds; a round: a barrier, then every pair moves one
request of ``request_blocks`` blocks over all layers in one push and the receiver waits for
it): each path, and ``auto`` (which path it took is recorded), contiguous and fragmented
block ids, against the bound: one device copy of the same bytes as one range
(``frac_of_bound`` = copy time / path time).
"""

from __future__ import annotations

import random
import time

import torch

from ...kv import KVTransfer, reference_transfer
from .rank import checks_then_timings


def _geo(rk, big: bool) -> dict:
    if rk.cfg["interpret"]:
        return dict(num_layers=2, num_blocks=12, block_size=4, head_dim=8)
    if big:
        return dict(num_layers=8, num_blocks=256, block_size=16, head_dim=128)
    return dict(num_layers=3, num_blocks=48, block_size=16, head_dim=64)


def _ids(seed: int, n: int, blocks: int, fragmented: bool) -> list[int]:
    rng = random.Random(seed)
    if not fragmented:
        return list(range(n))
    return rng.sample(range(blocks), n)


def _data(shape, dtype, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(shape, generator=g).to(dtype)


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.detach().cpu().contiguous().view(torch.uint8)


#: (dtype, sender heads, receiver heads, path)
CASES = [("bfloat16", 4, 4, "kernel"), ("bfloat16", 4, 4, "copy_engine"),
         ("float8_e4m3fn", 4, 4, "kernel"), ("float8_e4m3fn", 4, 4, "copy_engine"),
         ("bfloat16", 4, 2, "kernel"), ("bfloat16", 4, 2, "copy_engine")]


def _pair(rk):
    sender = rk.r % 2 == 0
    peer = rk.r + 1 if sender else rk.r - 1
    return sender, (peer if peer < rk.w else None)


def _check(rk, case, seed: int) -> int:
    """One request moved layer by layer; wrong bytes on this rank (receivers), or raises."""
    dt, h_src, h_dst, path = case
    dtype = getattr(torch, dt)
    sender, peer = _pair(rk)
    geo = _geo(rk, big=False)
    kv = KVTransfer(rk.comm, timeout=60)
    heads = h_src if sender else h_dst
    cache = kv.paged_cache(kv_heads=heads, dtype=dtype, device=rk.dev, **geo)
    n = max(2, geo["num_blocks"] // 3)
    pair = rk.r // 2
    src_ids = _ids(seed * 31 + pair, n, geo["num_blocks"], True)
    dst_ids = _ids(seed * 37 + pair, n, geo["num_blocks"], True)
    split = None if h_src == h_dst else (h_src - h_dst, 0, h_dst)
    wrong = 0
    try:
        if peer is None:
            return 0
        src_shape = cache.shape[:4] + (h_src, cache.shape[5])
        if sender:
            cache.copy_(_data(src_shape, dtype, 1000 * seed + pair).to(cache.device))
            for i in range(geo["num_layers"]):
                ph = kv.push(f"c{seed}", dst=peer, block_ids=src_ids,
                             layers=range(i, i + 1), head_split=split, path=path)
                if ph.path != path:
                    raise AssertionError(f"push took path {ph.path!r}, asked for {path!r}")
                ph.wait()
        else:
            h = kv.expect(f"c{seed}", src=peer, block_ids=dst_ids)
            if rk.cuda:
                for i in range(geo["num_layers"]):
                    h.wait_on_device(i)
                kv.check_device()
            h.wait()
            want = reference_transfer(_data(src_shape, dtype, 1000 * seed + pair),
                                      torch.zeros(cache.shape, dtype=dtype), src_ids, dst_ids,
                                      head_split=split)
            wrong = int((_bits(cache) != _bits(want)).sum())
    finally:
        kv.close()
    return wrong


def checks(rk, deadline: float) -> list[dict]:
    out = []
    for i, case in enumerate(CASES):
        dt, hs, hd, path = case
        rec = dict(phase="kv", case=f"kv/w{rk.w}/{dt}/h{hs}to{hd}/fragmented/{path}",
                   kernel=f"kv/{path}", world=rk.w, dtype=dt)
        if not rk.in_time(deadline):
            out.append(rk.skipped(rec))
            continue
        rec = rk.judged(rec, lambda case=case, i=i: _check(rk, case, i + 1))
        out.append(rec)
        rk.log(rec)
    return out


def timings(rk, deadline: float) -> list[dict]:
    sender, peer = _pair(rk)
    geo = _geo(rk, big=True)
    nb = 4 if rk.cfg["interpret"] else 64
    rounds = 2 if rk.cfg["interpret"] else 10
    rows = []
    kv = KVTransfer(rk.comm, timeout=60)
    cache = kv.paged_cache(kv_heads=8, dtype=torch.bfloat16, device=rk.dev, **geo)
    nbytes = geo["num_layers"] * 2 * nb * cache[0, 0, 0].numel() * 2
    flat = cache.view(-1).view(torch.uint8)
    src_b, dst_b = flat[:nbytes], flat[nbytes:2 * nbytes]
    seq = [0]
    try:
        for fragmented in (False, True):
            rec = dict(phase="kv", case=f"kv/time/w{rk.w}/bfloat16/L{geo['num_layers']}"
                                        f"xB{nb}x{geo['block_size']}x8x{geo['head_dim']}/"
                                        f"{'fragmented' if fragmented else 'contiguous'}",
                       world=rk.w, bytes=nbytes, us={}, errors={}, auto_path=None)
            if not rk.in_time(deadline):
                rec["errors"]["tilecomm kernel"] = "skipped: phase budget spent"
                rows.append(rec)
                continue
            src_ids = _ids(7, nb, geo["num_blocks"], fragmented)
            dst_ids = _ids(8, nb, geo["num_blocks"], fragmented)
            taken = []

            def one(path):
                seq[0] += 1
                rid = f"t{seq[0]}"
                h = None
                if peer is not None and not sender:
                    h = kv.expect(rid, src=peer, block_ids=dst_ids)
                rk.comm.barrier()
                t0 = time.perf_counter()
                if peer is not None and sender:
                    ph = kv.push(rid, dst=peer, block_ids=src_ids, path=path)
                    taken.append(ph.path)
                    ph.wait()
                elif h is not None:
                    h.wait()
                rk.sync()
                return time.perf_counter() - t0

            for path in ("kernel", "copy_engine", "auto"):
                def time_it(path=path):
                    one(path)                              # warm: compile, calibrate
                    return [one(path) for _ in range(rounds)]
                rk.timed_into(rec, f"tilecomm {path}", time_it, rounds)
            rec["auto_path"] = taken[-1] if taken else None
            # the costs auto fitted on this device (None on a rank that pushed nothing)
            rec["auto_costs"] = kv.chooser.describe() if kv.chooser is not None else None

            def copy_it():
                secs = []
                for _ in range(rounds + 1):
                    rk.comm.barrier()
                    t0 = time.perf_counter()
                    dst_b.copy_(src_b)
                    rk.sync()
                    secs.append(time.perf_counter() - t0)
                return secs[1:]
            rk.timed_into(rec, "device copy of the bytes", copy_it, rounds)
            us = rec["us"]
            if "device copy of the bytes" in us:
                rec["frac_of_bound"] = {p: us["device copy of the bytes"] / us[f"tilecomm {p}"]
                                        for p in ("kernel", "copy_engine", "auto")
                                        if f"tilecomm {p}" in us}
            rows.append(rec)
            rk.log(rec)
    finally:
        kv.close()
    return rows


def run(rk, deadline: float) -> list[dict]:
    return checks_then_timings(rk, deadline, checks, timings, 0.5)


def text_lines(rows: list[dict]) -> list[str]:
    rows = [t for t in rows if "us" in t]
    if not rows:
        return []
    lines = ["", "KV transfer, one request per pair (us, slowest rank; fraction of the bound: "
                 "a device copy of the same bytes / the path's time):"]
    for t in rows:
        cells = "  ".join(f"{k}: {v:.1f}" for k, v in t["us"].items())
        frac = "  ".join(f"{k} {100 * v:.0f}%" for k, v in (t.get("frac_of_bound") or {}).items())
        lines.append(f"  {t['case']:52s} {cells}  [{frac}]  auto took {t.get('auto_path')}")
        for lab, e in t["errors"].items():
            lines.append(f"  {'':52s} {lab}: {e}")
    return lines

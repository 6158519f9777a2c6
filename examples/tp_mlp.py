"""A sequence-parallel tensor-parallel MLP trained with the fused ops, next to the unfused one.

    torchrun --standalone --nproc-per-node 2 examples/tp_mlp.py
    torchrun --standalone --nproc-per-node 2 examples/tp_mlp.py --steps 5 --json out.json

Each rank holds ``tokens / W`` rows of the activations (sequence parallelism) and a slice of
both weights: ``w1 [d, f/W]`` (column parallel) and ``w2 [f/W, d]`` (row parallel).

    fused:    y = matmul_reduce_scatter(gelu(all_gather_matmul(x, w1)), w2)
    unfused:  y = reduce_scatter(gelu(all_gather(x) @ w1) @ w2)

Both train from the same initial weights on the same data with plain SGD; the backward of
each fused op is the other fused op (tilecomm.ops.autograd), the unfused version's is the
other collective. Rank 0 prints both loss curves (the loss summed over ranks) and their largest
relative difference: the two compute the same math, with the GEMMs cut into different shapes
(per-chunk in the fused ops), so the float32 losses agree to rounding, not bit for bit.
The script ends with ``PASS`` when every step's fused loss is within ``--tol`` (1e-5 relative:
float32 rounding gives ~1e-7, a wrong chunk ~1) of the unfused one and the loss fell, and
``FAIL`` with exit status 1 (every rank) otherwise; ``tests/ops/test_tp_mlp_example.py`` runs it.
"""

from __future__ import annotations

import argparse
import json
import math

import torch

import tilecomm
from tilecomm.ops import all_gather_matmul, matmul_reduce_scatter


class _Gather(torch.autograd.Function):
    """all_gather along rows; backward: reduce_scatter of the gradient."""

    @staticmethod
    def forward(ctx, x, comm):
        ctx.comm = comm
        return comm.all_gather(x.detach().contiguous())

    @staticmethod
    def backward(ctx, g):
        return ctx.comm.reduce_scatter(g.contiguous()), None


class _Scatter(torch.autograd.Function):
    """reduce_scatter along rows; backward: all_gather of the gradient."""

    @staticmethod
    def forward(ctx, y, comm):
        ctx.comm = comm
        return comm.reduce_scatter(y.detach().contiguous())

    @staticmethod
    def backward(ctx, g):
        return ctx.comm.all_gather(g.contiguous()), None


def mlp(x, w1, w2, comm, fused: bool):
    """``x [T/W, d]`` -> ``[T/W, d]``."""
    if fused:
        return matmul_reduce_scatter(torch.nn.functional.gelu(all_gather_matmul(x, w1, comm)),
                                     w2, comm)
    h = torch.nn.functional.gelu(_Gather.apply(x, comm) @ w1)
    return _Scatter.apply(h @ w2, comm)


def train(comm, fused: bool, steps: int, tokens: int, d: int, f: int, lr: float) -> list[float]:
    w, r = comm.world_size, comm.rank
    g = torch.Generator().manual_seed(0)          # same full weights and data on every rank
    w1_full = torch.randn(d, f, generator=g) / d ** 0.5
    w2_full = torch.randn(f, d, generator=g) / f ** 0.5
    target_map = torch.randn(d, d, generator=g) / d ** 0.5
    cols = slice(r * f // w, (r + 1) * f // w)
    w1 = w1_full[:, cols].clone().requires_grad_()
    w2 = w2_full[cols].clone().requires_grad_()
    rows = slice(r * tokens // w, (r + 1) * tokens // w)
    losses = []
    for step in range(steps):
        x_full = torch.randn(tokens, d, generator=torch.Generator().manual_seed(100 + step))
        x = x_full[rows].clone()
        target = torch.tanh(x @ target_map)
        y = mlp(x, w1, w2, comm, fused)
        loss = ((y - target) ** 2).sum() / tokens   # this rank's part of the mean
        loss.backward()
        with torch.no_grad():
            for p in (w1, w2):
                p -= lr * p.grad
                p.grad = None
        total = comm.all_reduce(loss.detach().reshape(1).clone())
        losses.append(float(total))
    return losses


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--tokens", type=int, default=64, help="rows in all (a multiple of W)")
    ap.add_argument("--d", type=int, default=32, help="model width")
    ap.add_argument("--f", type=int, default=128, help="MLP width (a multiple of W)")
    ap.add_argument("--lr", type=float, default=0.05)
    ap.add_argument("--tol", type=float, default=1e-5,
                    help="largest relative loss difference that passes (float32 rounding: ~1e-7)")
    ap.add_argument("--json", help="rank 0 writes {fused, unfused, max_rel_diff} here")
    a = ap.parse_args()
    if not a.tol > 0:
        ap.error(f"--tol must be > 0, got {a.tol}")
    torch.set_num_threads(1)
    comm = tilecomm.init(deterministic=True)    # rank-order reduce_scatter in the baseline
    try:
        fused = train(comm, True, a.steps, a.tokens, a.d, a.f, a.lr)
        unfused = train(comm, False, a.steps, a.tokens, a.d, a.f, a.lr)
    finally:
        comm.close()
    diffs = [abs(x - y) / max(abs(y), 1e-30) for x, y in zip(fused, unfused)]
    # max() skips a NaN that is not first (NaN > d is False): a diverged run's inf - inf must
    # not read as agreement
    rel = float("nan") if any(math.isnan(d) for d in diffs) else max(diffs)
    if comm.rank == 0:
        print(f"{'step':>4} {'fused loss':>14} {'unfused loss':>14}")
        for i, (x, y) in enumerate(zip(fused, unfused)):
            print(f"{i:4d} {x:14.8f} {y:14.8f}")
        print(f"largest relative difference: {rel:.2e}")
        if a.json:
            with open(a.json, "w") as fh:
                json.dump({"fused": fused, "unfused": unfused, "max_rel_diff": rel}, fh)
    # The losses are all_reduced, so every rank reaches the same verdict and exits the same
    # way (torchrun then reports one failure, not a rank left waiting).
    bad = []
    if not rel <= a.tol:                                   # NaN fails too
        bad.append(f"largest relative difference {rel:.2e} above the tolerance {a.tol:g}")
    if len(fused) > 1 and not fused[-1] < fused[0]:
        bad.append(f"the fused loss did not fall ({fused[0]:.6g} -> {fused[-1]:.6g})")
    if bad:
        if comm.rank == 0:
            print("FAIL: " + "; ".join(bad) + " (fused against unfused)")
        raise SystemExit(1)
    if comm.rank == 0:
        print(f"PASS: the fused MLP's losses match the unfused one's over {len(fused)} steps "
              f"(largest relative difference {rel:.2e}; tolerance {a.tol:g}) and fell "
              f"{fused[0]:.6g} -> {fused[-1]:.6g}")


if __name__ == "__main__":
    main()

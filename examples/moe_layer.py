"""A mixture-of-experts layer over tilecomm's dispatch/combine, forward and backward, checked
against the same layer in one process.

    python examples/moe_layer.py -n 2                 # 2 ranks over shared memory
    python examples/moe_layer.py -n 4 --layout normal --tokens 32

The layer is what an expert-parallel MoE block does, with the all_to_all replaced by two calls:

    logits = x @ router                       # [T, E], the router is replicated
    w, idx = softmax(logits).topk(K)          # each token picks K experts
    d = ep.dispatch(x, idx, w)                # rows to the ranks owning the experts
    y = experts(d)                            # this rank's E/W experts (a grouped GEMM)
    out = ep.combine(y, d)                    # [T, H] back on the token's rank

Rank ``r`` owns experts ``[r*E/W, (r+1)*E/W)``: ``w1 [E/W, H, F]``, ``w2 [E/W, F, H]``. The
backward goes through the same two calls (:mod:`tilecomm.moe.autograd`); the router's
gradient is summed over the ranks (as data parallelism would) and the experts' gradients stay
where the experts live. The reference computes every token with every expert in one process
from the same weights; the two agree to float32 rounding (the GEMMs see other batch shapes).
The script ends with ``PASS`` when every relative error is within ``--tol`` (1e-5: float32
rounding is ~1e-7, a misrouted row is ~1) and ``FAIL`` with exit status 1 otherwise;
``tests/moe/test_moe_autograd.py`` runs it.
"""

from __future__ import annotations

import argparse
import json

import torch

import tilecomm
from tilecomm.moe import ExpertParallel


def weights(h: int, f: int, e: int, seed: int = 0):
    """Every rank builds the same global weights: router [H, E], w1 [E, H, F], w2 [E, F, H]."""
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(h, e, generator=g) / h ** 0.5,
            torch.randn(e, h, f, generator=g) / h ** 0.5,
            torch.randn(e, f, h, generator=g) / f ** 0.5)


def tokens_of(rank: int, t: int, h: int, seed: int = 0) -> torch.Tensor:
    """This rank's activations ``[t, H]`` float32."""
    return torch.randn(t, h, generator=torch.Generator().manual_seed(1000 + seed + rank))


def route(x: torch.Tensor, router: torch.Tensor, k: int):
    """``(topk_idx [T, K] int64, topk_weights [T, K] float32)``."""
    w, idx = torch.softmax(x @ router, dim=-1).topk(k, dim=-1)
    return idx, w


def expert(x: torch.Tensor, w1: torch.Tensor, w2: torch.Tensor) -> torch.Tensor:
    return torch.nn.functional.silu(x @ w1) @ w2


def moe_forward(ep: ExpertParallel, x, router, w1, w2, k: int, layout: str):
    """``x [T, H]`` -> ``[T, H]``; ``w1``/``w2`` hold this rank's ``E/W`` experts."""
    idx, w = route(x, router, k)
    d = ep.dispatch(x, idx, w)
    if layout == "grouped":
        g = d.grouped()                 # rows per expert contiguous: one GEMM each
        off = g.offsets.tolist()
        y = torch.cat([expert(g.x[off[e]:off[e + 1]], w1[e], w2[e])
                       for e in range(ep.experts_per_rank)])
        return ep.combine(y, g)
    y = torch.zeros_like(d.x)           # normal layout: weight and sum per received row
    for e in range(ep.experts_per_rank):
        rows, ks = (d.topk_idx == e).nonzero(as_tuple=True)
        y = y.index_add(0, rows, d.topk_weights[rows, ks, None] * expert(d.x[rows], w1[e],
                                                                         w2[e]))
    return ep.combine(y, d)


def reference(xs: list[torch.Tensor], router, w1, w2, k: int):
    """The same layer in one process: ``(outs per rank, grads)`` for the loss ``sum(out**2)``."""
    xs = [x.clone().requires_grad_() for x in xs]
    router, w1, w2 = (p.clone().requires_grad_() for p in (router, w1, w2))
    outs, loss = [], 0
    for x in xs:
        idx, w = route(x, router, k)
        out = torch.zeros_like(x)
        for t in range(x.shape[0]):
            for j in range(k):
                e = int(idx[t, j])
                out = out.index_add(0, torch.tensor([t]),
                                    w[t, j] * expert(x[t:t + 1], w1[e], w2[e]))
        outs.append(out)
        loss = loss + (out ** 2).sum()
    loss.backward()
    return [o.detach() for o in outs], dict(x=[torch.zeros_like(x) if x.grad is None else x.grad
                                               for x in xs], router=router.grad,
                                            w1=w1.grad, w2=w2.grad)


def run_rank(comm, tokens: list[int], h: int, f: int, e: int, k: int, layout: str,
             seed: int = 0) -> dict:
    """One training step's forward and backward on this rank; returns plain tensors."""
    router, w1, w2 = weights(h, f, e, seed)
    el = e // comm.world_size
    mine = slice(comm.rank * el, (comm.rank + 1) * el)
    router = router.clone().requires_grad_()
    w1 = w1[mine].clone().requires_grad_()
    w2 = w2[mine].clone().requires_grad_()
    x = tokens_of(comm.rank, tokens[comm.rank], h, seed).requires_grad_()
    ep = ExpertParallel(comm, num_experts=e, hidden=h, dtype=torch.float32)
    out = moe_forward(ep, x, router, w1, w2, k, layout)
    (out ** 2).sum().backward()
    grad_router = comm.all_reduce(router.grad.contiguous())     # the data-parallel sum
    return dict(out=out.detach(), x=x.grad, router=grad_router, w1=w1.grad, w2=w2.grad)


def compare(results: list[dict], tokens, h, f, e, k, seed: int = 0) -> dict:
    """Largest relative error of each quantity against :func:`reference`."""
    router, w1, w2 = weights(h, f, e, seed)
    xs = [tokens_of(r, t, h, seed) for r, t in enumerate(tokens)]
    outs, grads = reference(xs, router, w1, w2, k)
    el = e // len(results)

    def rel(a, b):
        return float((a - b).abs().max() / b.abs().max().clamp_min(1e-30)) if b.numel() else 0.

    err = {"out": max(rel(res["out"], o) for res, o in zip(results, outs)),
           "grad x": max(rel(res["x"], g) for res, g in zip(results, grads["x"])),
           "grad router": max(rel(res["router"], grads["router"]) for res in results)}
    for name in ("w1", "w2"):
        err["grad " + name] = max(rel(res[name], grads[name][r * el:(r + 1) * el])
                                  for r, res in enumerate(results))
    return err


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("-n", "--ranks", type=int, default=2)
    ap.add_argument("--tokens", type=int, default=24, help="tokens on rank 0 (rank r: fewer)")
    ap.add_argument("--hidden", type=int, default=64)
    ap.add_argument("--ffn", type=int, default=32)
    ap.add_argument("--experts", type=int, default=8)
    ap.add_argument("--topk", type=int, default=2)
    ap.add_argument("--layout", choices=("grouped", "normal"), default="grouped")
    ap.add_argument("--tol", type=float, default=1e-5,
                    help="largest relative error that passes (float32 rounding: ~1e-7)")
    ap.add_argument("--json", help="write the errors here")
    a = ap.parse_args(argv)
    if not a.tol > 0:
        ap.error(f"--tol must be > 0, got {a.tol}")
    tokens = [max(0, a.tokens - 5 * r) for r in range(a.ranks)]     # uneven, maybe zero
    results = tilecomm.launch(run_rank, a.ranks, tokens, a.hidden, a.ffn, a.experts, a.topk,
                              a.layout)
    err = compare(results, tokens, a.hidden, a.ffn, a.experts, a.topk)
    for name, v in err.items():
        print(f"{name:12s} max relative error vs one process: {v:.2e}")
    if a.json:
        with open(a.json, "w") as fh:
            json.dump(err, fh, indent=1)
    bad = [name for name, v in err.items() if not v <= a.tol]     # NaN fails too
    if bad:
        print("FAIL: " + ", ".join(f"{name} {err[name]:.2e}" for name in bad) +
              f" above the tolerance {a.tol:g} (relative error vs one process)")
        raise SystemExit(1)
    worst = max(err, key=err.get)
    print(f"PASS: forward and backward match one process (largest relative error "
          f"{err[worst]:.2e}, {worst}; tolerance {a.tol:g})")
    return err


if __name__ == "__main__":
    main()

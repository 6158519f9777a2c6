"""Per-rank MoE scenarios for tilecomm.launch / simulated hosts, and their inputs.

Inputs are made from (seed, rank) alone, so the test process rebuilds every rank's inputs and
runs :mod:`tilecomm.moe.reference` on them. Experts' "outputs" are deterministic functions of
the rows (expert e scales by e + 1 and adds the local rank), so a wrong row, a wrong weight or
a wrong order shows in the bits.
"""

from __future__ import annotations

import torch

from tilecomm.moe import ExpertParallel, routing  # noqa: F401 - routing: for the tests
from tilecomm.moe.synthetic import (expert_output, inputs, normal_rows,  # noqa: F401
                                    reference_combined)

H, K, E = 256, 4, 8


def roundtrip(comm, tokens, seed=0, dtype=torch.bfloat16, integer=False, fp8=False,
              layouts=("normal", "grouped", "low_latency"), m=None, e=E, h=H):
    """Dispatch then combine in each layout; returns plain tensors for the test to compare."""
    ep = ExpertParallel(comm, num_experts=e, hidden=h, dtype=dtype)
    x, idx, w = inputs(comm.rank, tokens[comm.rank], dtype=dtype, seed=seed, integer=integer,
                       e=e, h=h)
    out = {}
    for lay in layouts:
        if lay == "low_latency":
            out[lay] = low_latency_step(comm, ep, x, idx, w, m or max(tokens), fp8, dtype)
            continue
        d = ep.dispatch(x, idx, w, fp8=fp8)
        if lay == "grouped":
            g = d.grouped()
            xs = g.x.to(torch.float32) if fp8 else g.x
            if fp8:
                from tilecomm.moe.fp8 import dequantize
                xs = dequantize(g.x, g.scales, dtype)
            e_of = d.topk_idx[g.row, g.k]
            y = expert_output(xs, e_of, comm.rank)
            res = ep.combine(y, g)
            out[lay] = dict(offsets=g.offsets, row=g.row, k=g.k, out=res)
        else:
            y = normal_rows(d, comm.rank, dtype)
            res = ep.combine(y, d)
            out[lay] = dict(x=bits(d.x), scales=d.scales, src_rank=d.src_rank, src_token=d.src_token,
                            topk_idx=d.topk_idx, topk_weights=d.topk_weights,
                            tokens_per_expert=d.tokens_per_expert, y=y, out=res)
    return out


def low_latency_step(comm, ep, x, idx, w, m, fp8, dtype) -> dict:
    """One low-latency dispatch and combine (the experts: :func:`expert_output` on every
    slot), as plain tensors for :func:`check`."""
    d = ep.dispatch(x, idx, w, mode="low_latency", max_tokens_per_rank=m, fp8=fp8)
    xs = d.dequantized(dtype) if fp8 else d.x
    y = torch.zeros_like(xs)
    for le in range(ep.el):       # every slot: the reference only reads valid ones
        y[le] = expert_output(xs[le], torch.full((xs.shape[1],), le), comm.rank)
    res = ep.combine(y, d)
    valid = [[(d.src_rank[le] == s).sum().item() for s in range(comm.world_size)]
             for le in range(ep.el)]
    # (slot: the host path's per-row index; the kernel engine's device path has no per-row
    # fields, their number being data-dependent)
    return dict(x=bits(d.x).clone(), count=d.count.clone(),
                slot=None if d.slot is None else d.slot.clone(), valid=valid,
                scales=None if d.scales is None else d.scales.clone(),
                src_rank=d.src_rank.clone(), src_token=d.src_token.clone(), out=res)


def bits(t: torch.Tensor) -> torch.Tensor:
    """The raw bytes of a tensor (exact comparison, -0.0 and NaN included)."""
    return t.contiguous().view(torch.uint8)


def check(results, tokens, *, seed=0, dtype=torch.bfloat16, integer=False, fp8=False,
          host_of=None, e=E, m=None, h=H):
    """Compare ``roundtrip`` results of every rank with the reference, bit for bit."""
    from tilecomm.moe import reference as R
    w = len(tokens)
    ins = [inputs(r, tokens[r], dtype=dtype, seed=seed, integer=integer, e=e, h=h)
           for r in range(w)]
    ref = R.dispatch([i[0] for i in ins], [i[1] for i in ins], [i[2] for i in ins], e, fp8=fp8)
    for r in range(w):
        got = results[r].get("normal")
        if got is None:
            continue
        for key in ("x", "src_rank", "src_token", "topk_idx", "topk_weights",
                    "tokens_per_expert") + (("scales",) if fp8 else ()):
            assert torch.equal(bits(got[key]), bits(ref[r][key])), (r, key)
    el = e // w
    outs = reference_combined(ref, tokens, dtype, fp8, host_of=host_of)
    for r in range(w):
        for lay, got in results[r].items():
            assert torch.equal(bits(got["out"]), bits(outs[r])), (r, lay)
        ll = results[r].get("low_latency")
        if ll is not None:
            want = R.low_latency(ref[r], w, el, m or max(tokens))
            assert torch.equal(ll["count"], want["count"]), r
            if ll["slot"] is not None:
                assert torch.equal(ll["slot"], want["slot"]), r
            mm = m or max(tokens)
            for le in range(el):
                for s in range(w):
                    n = ll["valid"][le][s]
                    sl = slice(s * mm, s * mm + n)
                    assert torch.equal(bits(ll["x"][le, sl]), bits(want["x"][le, sl])), (r, le, s)
                    assert (ll["src_rank"][le, sl] == s).all()
    return ref


GH, GK = 16, 3       # the gradient cases: small rows, integer data


def grad_inputs(rank, t, e, seed=0):
    g = torch.Generator().manual_seed(seed * 100 + rank)
    x = torch.randint(-4, 5, (t, GH), generator=g).to(torch.float32)
    idx = routing.random_topk(t, GK, e, generator=g, drop=0.25)
    w = 2.0 ** torch.randint(-2, 2, (t, GK), generator=g).to(torch.float32)
    grad_out = torch.randint(-3, 4, (t, GH), generator=g).to(torch.float32)
    return x, idx, w, grad_out


def grad_closed_form(x, idx, w, grad_out):
    """Expert e multiplies by e + 1: out[t] = sum_k w[t,k] (idx[t,k]+1) x[t], and the loss is
    sum(out * grad_out)."""
    f = torch.where(idx >= 0, idx + 1, 0).to(torch.float32)
    gx = grad_out * (w * f).sum(1, keepdim=True)
    gw = f * (x * grad_out).sum(1, keepdim=True)
    return gx, gw


def grad_roundtrip(comm, tokens, e, layout):
    """Forward and backward through dispatch/combine; returns (grad x, grad topk_weights)."""
    ep = ExpertParallel(comm, num_experts=e, hidden=GH, dtype=torch.float32)
    x, idx, w, grad_out = grad_inputs(comm.rank, tokens[comm.rank], e)
    x.requires_grad_()
    w.requires_grad_()
    d = ep.dispatch(x, idx, w)
    first = comm.rank * ep.experts_per_rank
    if layout == "grouped":
        g = d.grouped()
        f = (d.topk_idx[g.row, g.k] + first + 1).to(torch.float32)
        out = ep.combine(g.x * f[:, None], g)
    else:
        f = torch.where(d.topk_idx >= 0, d.topk_idx + first + 1, 0).to(torch.float32)
        out = ep.combine(d.x * (d.topk_weights * f).sum(1, keepdim=True), d)
    (out * grad_out).sum().backward()
    return x.grad, w.grad



def check_grads(results, tokens, e) -> None:
    """Every rank's gradients equal the closed form, bit for bit."""
    for r, (gx, gw) in enumerate(results):
        x, idx, w, grad_out = grad_inputs(r, tokens[r], e)
        want_x, want_w = grad_closed_form(x, idx, w, grad_out)
        assert torch.equal(gx, want_x), f"rank {r}: grad of x"
        assert torch.equal(gw, want_w), f"rank {r}: grad of topk_weights"

"""CPU engine of the fused ops: the GEMM reads (and the reduction reads) the peers' shared
memory in place, so the all-gather and the reduce-scatter copy nothing.

Every rank of a CPU communicator maps every other rank's segment (``comm.alloc`` +
``comm.peer``), so a "transfer" is just the GEMM's loads from a peer's memory. One host
handshake per call (the descriptor exchange of :mod:`tilecomm.ops.checks`) both checks the call
and tells every rank that every other rank has published its data; the local compute is put
*before* it so that it overlaps the wait for slower peers:

all_gather_matmul (``a_shard [m, K]``, ``b [K, N]`` -> ``[W*m, N]``)
    publish: copy ``a_shard`` into this rank's chunk of a symmetric workspace; multiply the own
    chunk (only local data); handshake; then multiply the peers' chunks in rotation order
    ``rank+1, rank+2, ...`` (ranks do not all read one peer at a time), each straight from
    the peer's workspace.
matmul_reduce_scatter (``a [W*m, K_r]``, ``b [K_r, N]`` -> ``[m, N]``)
    compute the partial of every owner's rows (input dtype) into this rank's workspace (all
    local); handshake; then this rank reads the partial of its own rows from every rank's
    workspace and adds them in float32 in rank order 0..W-1, rounding once.

Each product is one ``torch.matmul`` per chunk in the input dtype
(:func:`reference.chunk_gemm`, written straight into the output or the workspace): exactly
what the references compute, so the results are the references' bits.

Reuse of the workspace: it has two halves, used by alternate calls. Call ``k`` writes half
``k % 2`` before its handshake; the last reads of that half were made in call ``k - 2``, which
every rank finished before it entered the handshake of call ``k - 1``, which this rank has
passed. A workspace too small for a call is replaced after the handshake (collectively: the
ranks agree on the shapes by then, so they make the same decision), followed by a barrier.
"""

from __future__ import annotations

import weakref

import torch

from . import checks
from .workspace import Workspace as _Workspace, round_up as _round

_STATE: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


def _workspace(comm, kind: str) -> _Workspace:
    per = _STATE.setdefault(comm, {})
    ws = per.get(kind)
    if ws is None:
        ws = per[kind] = _Workspace()
    return ws


def _ok(t) -> bool:
    return t.type == "cpu"


def all_gather_matmul(comm, a, b, out=None, return_gathered=False, copy="kernel"):
    """See :func:`tilecomm.ops.all_gather_matmul` (CPU tensors). ``copy`` is checked and
    agreed like on the kernel engine, but both values run the same code here: this engine
    copies no chunk at all (the GEMM reads the peers' memory in place)."""
    w, me = comm.world_size, comm.rank
    ws = _workspace(comm, "ag")
    parity = ws.calls % 2
    ws.calls += 1
    shape = (lambda x, y: (w * x.shape[0], y.shape[1]))
    problem, _ = checks.local_problem(checks.OPS[0], a, b, out, shape, _ok, copy)
    ready = False
    if problem == 0:
        m, k = a.shape
        chunk = _round(m * k * a.element_size())
        if out is None:
            out = torch.empty((w * m, b.shape[1]), dtype=a.dtype)
        ready = ws.fits(w * chunk)
        if ready:
            ws.region(parity, me * chunk, (m, k), a.dtype).copy_(a)
        torch.matmul(a, b, out=out[me * m:(me + 1) * m])   # the own chunk, before the wait
    call = checks.agree(comm, checks.OPS[0], "cpu", a, b, out=out, out_shape=shape,
                        device_ok=_ok, flag=return_gathered, ready=ready, copy=copy)
    if not all(d[checks.F_READY] for d in call.descs):
        ws.grow(comm, w * chunk)
        ws.region(parity, me * chunk, (m, k), a.dtype).copy_(a)
        comm.barrier()
    gathered = torch.empty((w * m, k), dtype=a.dtype) if return_gathered else None
    for j in range(1, w):
        src = (me + j) % w
        shard = ws.region(parity, src * chunk, (m, k), a.dtype, rank=src, comm=comm)
        torch.matmul(shard, b, out=out[src * m:(src + 1) * m])   # reference.chunk_gemm
        if gathered is not None:
            gathered[src * m:(src + 1) * m].copy_(shard)
    if gathered is not None:
        gathered[me * m:(me + 1) * m].copy_(a)
        return out, gathered
    return out


def matmul_reduce_scatter(comm, a, b, out=None):
    """See :func:`tilecomm.ops.matmul_reduce_scatter` (CPU tensors)."""
    w, me = comm.world_size, comm.rank
    ws = _workspace(comm, "rs")
    parity = ws.calls % 2
    ws.calls += 1
    shape = (lambda x, y: (x.shape[0] // w, y.shape[1]) if x.shape[0] % w == 0 else None)
    problem, _ = checks.local_problem(checks.OPS[1], a, b, out, shape, _ok)
    ready = False
    if problem == 0 and a.shape[0] % w == 0:
        m, n = a.shape[0] // w, b.shape[1]
        part = _round(m * n * a.element_size())
        ready = ws.fits(w * part)
        if ready:
            _partials(ws, parity, a, b, m, n, part, me, w)
    call = checks.agree(comm, checks.OPS[1], "cpu", a, b, out=out, out_shape=shape,
                        device_ok=_ok, ready=ready)
    if not all(d[checks.F_READY] for d in call.descs):
        ws.grow(comm, w * part)
        _partials(ws, parity, a, b, m, n, part, me, w)
        comm.barrier()
    if out is None:
        out = torch.empty((m, n), dtype=a.dtype)
    parts = [ws.region(parity, me * part, (m, n), a.dtype, rank=s, comm=comm) for s in range(w)]
    return _sum_in_rank_order(parts, out)


def _sum_in_rank_order(parts: list, out: torch.Tensor) -> torch.Tensor:
    """``out = round(p_0 + p_1 + ... + p_{W-1})``: the ``[m, N]`` partials added left to right
    in float32 and rounded once to ``out``'s dtype (reference.matmul_reduce_scatter_reference),
    in as few passes over memory as that allows (the partials sit in the peers' memory).

    Two partials: one ``torch.add`` in their own dtype. For 16-bit floats torch's CPU add
    widens both to float32, adds and rounds once, which is exactly the reference's
    ``round(float(p_0) + float(p_1))`` (tested bit for bit on random data). A correctly rounded
    native 16-bit add would agree too: the float32 sum of two 16-bit values rounded to 16 bits
    never differs from the exact sum rounded once (float32's 24 bits >= 2 x 11 + 2). More
    partials: the float32 sum of all but the last, and the last add writes (rounding once)
    straight into ``out``.
    """
    if len(parts) == 1:
        return out.copy_(parts[0])
    if len(parts) == 2:
        return torch.add(parts[0], parts[1], out=out)
    acc = parts[0].to(torch.float32, copy=True)
    for p in parts[1:-1]:          # a 16-bit partial is widened exactly, added in float32
        acc.add_(p)
    return torch.add(acc, parts[-1], out=out)   # float32 add, one rounding to out's dtype


def _partials(ws, parity, a, b, m, n, part, me, w) -> None:
    """This rank's partial of every owner's rows in the input dtype (reference.chunk_gemm),
    owner ``c`` at ``c * part``; the next rank's first (the first to be read), the own rows
    last."""
    for j in range(1, w + 1):
        c = (me + j) % w
        torch.matmul(a[c * m:(c + 1) * m], b, out=ws.region(parity, c * part, (m, n), a.dtype))

"""MoE dispatch/combine on the Triton kernels of
:mod:`tilecomm.backends.triton.kernels.moe`, on a :class:`~tilecomm.device.DeviceHeap`.

CUDA tensors run them on the GPU (CUDA IPC heap, one host); CPU tensors run them in the Triton
interpreter on the shared-memory heap when the communicator runs CPU collectives on kernels
(``comm.use_cpu_kernels("triton")`` / TILECOMM_CPU_KERNELS=triton): slow, for testing the GPU
code without a GPU. Same interface and the same bits as :class:`.cpu.CpuEngine`.

Per call, on every rank (normal mode, like DeepEP's: the counts are agreed on the host first):

dispatch
    the handshake (:func:`checks.agree`: bad arguments raise on every rank before any buffer
    is touched; every rank gets ``counts[s][r]``); the tokens this rank sends to each
    destination (one ``nonzero`` of the destination mask) and one int32 metadata row per token
    (token index, ``topk_idx``, ``topk_weights``, fp8 scales, as raw words); one launch of
    ``moe_dispatch_push``: each row is *pushed* into the destination's symmetric receive
    buffer at ``offsets[s][r] + i`` (rows ordered by source rank, then token), then the
    destination is signalled; every rank waits (bounded) for every peer's signal;
    ``heap.check`` (a timeout raises ``CommTimeout``); the host copies the rows out.
combine
    the handshake; one launch of ``moe_combine_push``: the rows this rank holds for source
    ``s`` (contiguous in ``y``) go to ``s``'s symmetric combine buffer, destination by
    destination in rank order, then signal and wait as above; ``heap.check``; then
    ``moe_combine_sum`` adds, per token, the rows of the destinations in rank order in float32
    and rounds once (the order of :func:`.cpu.accumulate` on one host).

Buffers: two halves (``epoch % 2``) of a symmetric buffer per operation, so the host's
copy-out of call ``c`` (queued after the kernel on CUDA) is never overwritten by a peer's
call ``c + 1``; a peer can only start call ``c + 2`` after this rank entered its handshake,
i.e. after this rank's ``heap.check`` of call ``c + 1`` synchronized with everything queued
before. The half size is fixed until the buffer grows; growth is decided from the agreed
counts (the same on every rank) and happens after a heap barrier (no peer still reads or
writes the old buffer). Signals: one pad per operation, slot ``pid * W + p`` set to the
epoch by rank ``p`` only; epochs only grow, so pads are never reset.

Low-latency mode takes no host round trip after a layer's first call: ``ll_dispatch`` /
``ll_combine`` and NOTE [low latency on the device] in :mod:`.low_latency`.

Limits: one host (the heap maps the peers' memory); the combine sums in rank order (the one
host order of :func:`routing.combine_groups`).
"""

from __future__ import annotations

import weakref

import torch

from ..device.budget import cta_budget
from ..agree import compare
from ..errors import CommError
from ..settings import settings
from . import checks
from .cpu import Moved
from .low_latency import (ALIGN, DESC_WORDS, LowLatency, round_up, capturing, ll_buffers,
                          ll_positions)
from .routing import dest_mask

_STATE: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()
_WORDS = ((8, torch.int64), (4, torch.int32), (2, torch.int16), (1, torch.uint8))


def _kernels(device: torch.device):
    if device.type == "cpu":        # the interpreter must be on before triton is imported
        from ..device.heap import require_interpreter
        require_interpreter("the MoE kernel engine")
    from ..backends.triton.kernels import moe
    return moe


def _word(nbytes: int) -> tuple[int, torch.dtype]:
    """The widest machine word dividing a row of ``nbytes``."""
    for size, dt in _WORDS:
        if nbytes % size == 0:
            return size, dt
    raise AssertionError(nbytes)


def _words(t: torch.Tensor, rows: int, row_bytes: int, word: torch.dtype) -> torch.Tensor:
    """``t`` (contiguous, ``rows`` rows of ``row_bytes``) as ``[max(rows, 1), words]`` words
    (a one-row dummy when empty: the kernels get a valid pointer)."""
    size = torch.empty((), dtype=word).element_size()
    if rows == 0:
        return torch.zeros((1, max(1, row_bytes // size)), dtype=word, device=t.device)
    return t.contiguous().view(torch.uint8).reshape(rows, row_bytes).view(word)


def _aligned(*ts: torch.Tensor) -> bool:
    return all(t.data_ptr() % 16 == 0 for t in ts)


class _State:
    """One rank's heap, buffers, pads and epochs for one device type (collective creation);
    shared by every ExpertParallel layer of the communicator."""

    def __init__(self, comm, device: torch.device):
        from ..device import DeviceHeap
        from ..device.heap import SymmetricBuffers

        if comm.topology.num_hosts > 1:
            raise CommError("moe: the kernel engine maps the peers' memory, so all ranks must "
                            "be on one host")
        self.k = _kernels(device)
        self.heap = DeviceHeap.create(comm, device=device, nbytes=settings().device_heap_bytes)
        self.interpret = device.type == "cpu"
        w = comm.world_size
        # a launch is a (programs, W) grid: programs * W CTAs within the rank's CTA budget
        # (NOTE [CTA budget] in tilecomm.device.budget), at most GPU_PROGRAMS
        self.programs = 1 if self.interpret else min(
            self.k.GPU_PROGRAMS, cta_budget(comm.exchange, self.heap.device,
                                            interpret=False).programs(10**9, width=w))
        self.pads = {op: self.heap.signal_pad(self.programs * w) for op in checks.OPS}
        self.epochs = {op: 0 for op in checks.OPS}
        self._bufs = SymmetricBuffers(self.heap, ALIGN)
        #: low-latency buffers per (M, E, H, dtype size) (NOTE [low latency on the device])
        self.ll: dict = {}

    def next_epoch(self, op: str) -> int:
        self.epochs[op] += 1
        return self.epochs[op]

    def half(self, name: str, nbytes: int, epoch: int) -> torch.Tensor:
        """Half ``epoch % 2`` (uint8, at least ``nbytes``) of the two-half symmetric buffer
        ``name``; the half size stays fixed until the buffer grows (collective, after a heap
        barrier: a peer may still use the old one). Every rank asks for the same sizes."""
        buf = self._bufs.get(name, 2 * round_up(max(nbytes, 1)))
        half = buf.numel() // 2 // ALIGN * ALIGN
        lo = (epoch % 2) * half
        return buf[lo:lo + half]


def _state(comm, device: torch.device) -> _State:
    per = _STATE.setdefault(comm, {})
    st = per.get(device.type)
    if st is None:
        st = per[device.type] = _State(comm, device)
    return st


class KernelEngine:
    """The Triton kernel engine of :class:`~tilecomm.moe.ExpertParallel` (see the module
    docstring); the interface of :class:`.cpu.CpuEngine`."""

    def __init__(self, comm, device: torch.device):
        self.comm = comm
        self.device = torch.device(device)
        self.st = _state(comm, self.device)

    # ---- dispatch ---------------------------------------------------------------------------
    def dispatch(self, ep, mine: list[int], detail: str, x, scales, idx, wts) -> Moved:
        comm, st = self.comm, self.st
        me, w = comm.rank, comm.world_size
        call = checks.agree(comm, "dispatch", mine, detail)      # raises on every rank
        counts = call.counts()
        h, k = ep.hidden, mine[checks.F_K]
        fp8 = scales is not None
        xdt = x.dtype
        dev = x.device
        row_bytes = h * x.element_size()
        nb = scales.shape[1] if fp8 else 0
        mw = round_up(2 + 3 * k + nb, 4)                 # int32 words: token, idx, weights, scales
        t = x.shape[0]
        rows_at = [sum(counts[s][r] for s in range(w)) for r in range(w)]
        off_at = [sum(counts[q][r] for q in range(me)) for r in range(w)]   # offsets[me][r]
        # this rank's tokens per destination, destination by destination (token order)
        if t:
            mask = dest_mask(idx, ep.el, w)
            tok = mask.t().nonzero(as_tuple=True)[1]
            if tok.numel() != sum(counts[me]):   # the layer counted differently: never expected
                raise RuntimeError(f"moe dispatch: rank {me} announced {sum(counts[me])} rows "
                                   f"but its topk_idx selects {tok.numel()}")
            cols = [torch.arange(t, dtype=torch.int64, device=dev).unsqueeze(1)
                    .view(torch.int32), idx.view(torch.int32), wts.view(torch.int32)]
            if fp8:
                cols.append(scales.contiguous().view(torch.int32))
            pad = mw - (2 + 3 * k + nb)
            if pad:
                cols.append(torch.zeros((t, pad), dtype=torch.int32, device=dev))
            meta = torch.cat(cols, dim=1)
        else:
            tok = torch.zeros(1, dtype=torch.int64, device=dev)
            meta = torch.zeros((1, mw), dtype=torch.int32, device=dev)
        firsts, acc = [], 0
        for r in range(w):
            firsts.append(acc)
            acc += counts[me][r]
        plan = torch.tensor([firsts, counts[me], off_at], dtype=torch.int64, device=dev)
        wsize, word = _word(row_bytes)
        rw = row_bytes // wsize
        xw = _words(x, t, row_bytes, word)
        epoch = st.next_epoch("dispatch")
        most = max(rows_at)
        xb = round_up(most * row_bytes)
        half = st.half("dispatch", xb + most * mw * 4, epoch)
        recv_x = half[:max(xb, wsize)].view(word)
        recv_meta = half[xb:xb + max(most * mw * 4, 4)].view(torch.int32)
        aligned = int(row_bytes % 16 == 0 and _aligned(xw, meta, recv_x, recv_meta))
        heap = st.heap
        st.k.moe_dispatch_push[(st.programs, w)](
            xw, meta, tok, plan, recv_x, recv_meta, st.pads["dispatch"], heap.handle, epoch, rw,
            mw, WORLD=w, BX=self._block(rw), BM=self._block(mw, 64), ALIGNED=aligned)
        heap.check(f"moe dispatch (epoch {epoch})")
        # read this rank's rows out of the receive half (a peer's call c + 2 may reuse it)
        n = rows_at[me]
        out_x = recv_x[:n * rw].view(xdt).reshape(n, h).clone()
        m = recv_meta[:n * mw].reshape(n, mw).clone()      # the slices below: views of it
        src_tok = m[:, 0:2].contiguous().view(torch.int64).reshape(n)
        out_i = m[:, 2:2 + 2 * k].contiguous().view(torch.int64).reshape(n, k)
        out_w = m[:, 2 + 2 * k:2 + 3 * k].contiguous().view(torch.float32).reshape(n, k)
        out_s = m[:, 2 + 3 * k:2 + 3 * k + nb].contiguous().view(torch.float32) \
            .reshape(n, nb) if fp8 else None
        src_rank = torch.repeat_interleave(
            torch.arange(w, dtype=torch.int64),
            torch.tensor([counts[s][me] for s in range(w)], dtype=torch.int64)).to(dev)
        return Moved(out_x, out_s, out_i, out_w, src_rank, src_tok, call, counts)

    # ---- low-latency mode on the device (NOTE [low latency on the device]) ------------------
    def ll_dispatch(self, ep, x, scales, idx, wts, m: int, refuse: bool = False):
        """Device low-latency dispatch (NOTE [low latency on the device]): returns the
        ``Dispatched`` fields ``(x, scales, src_rank, src_token, count, LowLatency)``.
        ``refuse``: this rank rejected its arguments (``x`` etc. then have no rows): it still
        runs the kernel, so the epochs stay in step, with count -1 for every expert."""
        st, comm = self.st, self.comm
        w, el, h = comm.world_size, ep.el, ep.hidden
        dev = x.device
        t, k = idx.shape
        fp8 = scales is not None
        nb = scales.shape[1] if fp8 else 0
        bufs = ll_buffers(self, ep, m)
        m = ep.ll_max_tokens
        row_bytes = h * x.element_size()
        wsize, word = _word(row_bytes)
        rw = row_bytes // wsize
        mw = bufs.meta_words
        valid, e, pos, cnt = ll_positions(idx, ep.num_experts)
        if refuse:
            cnt = torch.full_like(cnt, -1)
        # int32 meta words per token: the token index (int64), the fp8 scales, padding
        cols = [torch.arange(t, dtype=torch.int64, device=dev).unsqueeze(1).view(torch.int32)]
        if fp8:
            cols.append(scales.contiguous().view(torch.int32))
        cols.append(torch.zeros((t, mw - 2 - nb), dtype=torch.int32, device=dev))
        meta = torch.cat(cols, dim=1) if t else torch.zeros((1, mw), dtype=torch.int32,
                                                            device=dev)
        flat_e = torch.where(valid, e, -1).reshape(-1) if t else \
            torch.full((1,), -1, dtype=torch.int64, device=dev)
        flat_pos = pos.reshape(-1) if t else torch.zeros(1, dtype=torch.int64, device=dev)
        desc = torch.empty(2, dtype=torch.int64, device=dev)    # fills: capturable, unlike
        desc[0].fill_(int(fp8))                                   # a copy from the host
        desc[1].fill_(k)
        xw = _words(x, t, row_bytes, word)
        half = bufs.calls["dispatch"] % 2
        bufs.calls["dispatch"] += 1
        rx, rmeta, rcnt = bufs.parts(half)
        epoch = bufs.epochs["dispatch"]
        epoch.add_(1)
        aligned = int(row_bytes % 16 == 0 and _aligned(xw, meta, rx, rmeta))
        heap = st.heap
        st.k.moe_ll_dispatch_push[(st.programs, w)](
            xw, meta, flat_e, flat_pos, cnt, desc, rx.view(word), rmeta.view(torch.int32),
            rcnt.view(torch.int64), bufs.pads["dispatch"], epoch, heap.handle, t * k, k, el, m,
            rw, mw, WORLD=w, BX=self._block(rw), BM=self._block(mw, 64), ALIGNED=aligned)
        words = rcnt.view(torch.int64)[:(el + DESC_WORDS) * w].view(el + DESC_WORDS, w)
        n = words[:el]
        if not capturing(dev):
            heap.check(f"moe low-latency dispatch (call {bufs.calls['dispatch']})")
            self._ll_agreed(words, el, refuse)
        n = n.clamp(min=0)          # a refusing rank (seen only outside capture): no rows
        out_x = rx.view(word)[:el * w * m * rw].view(x.dtype).view(el, w * m, h)
        mv = rmeta.view(torch.int32)[:el * w * m * mw].view(el, w, m, mw)
        ok = torch.arange(m, device=dev).view(1, 1, m) < n.unsqueeze(-1)
        ranks = torch.arange(w, dtype=torch.int64, device=dev).view(1, w, 1).expand(el, w, m)
        src_rank = torch.where(ok, ranks, -1).reshape(el, w * m)
        tok = mv[..., 0:2].contiguous().view(torch.int64).squeeze(-1)
        src_token = torch.where(ok, tok, -1).reshape(el, w * m)
        out_s = mv[..., 2:2 + nb].contiguous().view(torch.float32).reshape(el, w * m, nb) \
            if fp8 else None
        dest = torch.div(e, el, rounding_mode="floor")
        flat = torch.where(valid, e * m + pos, 0)
        handle = LowLatency(bufs, m, k, t, valid, dest, flat, wts, n)
        return out_x, out_s, src_rank, src_token, n.sum(1), handle

    def _ll_agreed(self, words: torch.Tensor, el: int, refuse: bool) -> None:
        """After a low-latency dispatch, outside capture: every source's call against this
        rank's (``words [El + 2, W]``: counts, then each source's fp8 and K)."""
        rows = words.tolist()
        w = self.comm.world_size
        refused = [s for s in range(w) if any(rows[le][s] < 0 for le in range(el))]
        if refused and not refuse:
            raise ValueError(f"moe low-latency dispatch: rank {refused[0]} rejected its call "
                             f"(its error names the argument); the call is void on every rank")
        if not refused:             # rows[el + i][s]: source s's fp8 (i = 0) and K (i = 1)
            compare("moe low-latency dispatch", [[rows[el][s], rows[el + 1][s]]
                                                 for s in range(w)],
                    [(0, "fp8", str), (1, "K (topk columns)", str)])

    def ll_combine(self, ep, y: torch.Tensor, handle: LowLatency) -> torch.Tensor:
        """Device low-latency combine: ``y [El, W*M, H]`` (unweighted, per slot) back to the
        sources, then on the source per token ``round(sum over ranks in order of round(sum over
        its k on that rank, in k order, of w * y)))`` in float32 (weighted_rows, then the rank-
        order sum of normal mode: the same bits)."""
        st, comm = self.st, self.comm
        w, el, h = comm.world_size, ep.el, ep.hidden
        m, k, bufs = handle.m, handle.k, handle.bufs
        dev = y.device
        row_bytes = h * ep.itemsize
        wsize, word = _word(row_bytes)
        rw = row_bytes // wsize
        yw = y.contiguous().view(torch.uint8).reshape(el * w * m, row_bytes).view(word)
        half = bufs.calls["combine"] % 2
        bufs.calls["combine"] += 1
        comb = bufs.comb[half * bufs.comb_half:(half + 1) * bufs.comb_half]
        epoch = bufs.epochs["combine"]
        epoch.add_(1)
        aligned = int(row_bytes % 16 == 0 and _aligned(yw, comb))
        heap = st.heap
        st.k.moe_ll_combine_push[(st.programs, w)](
            yw, handle.recv_cnt, comb.view(word), bufs.pads["combine"], epoch, heap.handle, el,
            m, rw, WORLD=w, BLOCK=self._block(rw * 4), ALIGNED=aligned)
        if not capturing(dev):
            heap.check(f"moe low-latency combine (call {bufs.calls['combine']})")
        t = handle.tokens
        if t == 0:
            return torch.empty((0, h), dtype=ep.dtype, device=dev)
        rows = comb.view(word)[:w * el * m * rw].view(ep.dtype).view(w * el * m, h)
        pairs = rows[handle.flat.reshape(-1)].view(t, k, h).to(torch.float32)
        prod = pairs * handle.weights.to(torch.float32).unsqueeze(-1)
        zero = torch.zeros((), dtype=torch.float32, device=dev)
        # on[t, k, r]: pair (t, k) went to rank r. Per (token, rank) the pairs in k order, one
        # op per k for all ranks at once (K + W launches, not K * W); adding +0 where a pair
        # went elsewhere changes nothing, as acc is never -0
        on = handle.valid.unsqueeze(-1) & (handle.dest.unsqueeze(-1) ==
                                           torch.arange(w, device=dev))
        acc = torch.zeros((t, w, h), dtype=torch.float32, device=dev)
        for j in range(k):
            acc = acc + torch.where(on[:, j, :, None], prod[:, j, None, :], zero)
        part = acc.to(ep.dtype).to(torch.float32)
        has = on.any(1)
        out = torch.zeros((t, h), dtype=torch.float32, device=dev)
        for r in range(w):               # one host: combine_groups is rank order
            out = out + torch.where(has[:, r:r + 1], part[:, r], zero)
        return out.to(ep.dtype)

    def _block(self, words: int, cap: int | None = None) -> int:
        """Words per block of a row copy: the row's next power of two, at most the GPU block
        (the interpreter: small rows, one block)."""
        cap = cap or self.st.k.BLOCK_GPU
        b = 1
        while b < words and b < cap:
            b *= 2
        return max(b, 16) if not self.st.interpret else b

    # ---- combine ----------------------------------------------------------------------------
    def combine(self, h: int, dtype: torch.dtype, mine: list[int], detail: str,
                rows: torch.Tensor, layout) -> torch.Tensor:
        """``rows [layout.rows, h]`` ``dtype`` -> ``[T, h]`` ``dtype`` (see the module doc)."""
        comm, st = self.comm, self.st
        me, w = comm.rank, comm.world_size
        checks.agree(comm, "combine", mine, detail)             # raises on every rank
        counts = layout.counts
        dev = rows.device
        isz = torch.empty((), dtype=dtype).element_size()
        row_bytes = h * isz
        wsize, word = _word(row_bytes)
        rw = row_bytes // wsize
        # destination side: the rows of source s are y[lo_s : lo_s + n_s]; they land in s's
        # buffer after the rows of the destinations below this rank
        lo = layout.offsets_at(me)
        plan = torch.tensor([lo, [counts[s][me] for s in range(w)],
                             [sum(counts[s][q] for q in range(me)) for s in range(w)]],
                            dtype=torch.int64, device=dev)
        yw = _words(rows, layout.rows, row_bytes, word)
        epoch = st.next_epoch("combine")
        most = max(sum(counts[s]) for s in range(w))
        half = st.half("combine", most * row_bytes, epoch)
        recv = half[:max(most * row_bytes, wsize)]
        aligned = int(row_bytes % 16 == 0 and _aligned(yw, recv))
        heap = st.heap
        st.k.moe_combine_push[(st.programs, w)](
            yw, plan, recv.view(word), st.pads["combine"], heap.handle, epoch, rw, WORLD=w,
            BLOCK=self._block(rw * 4), ALIGNED=aligned)
        heap.check(f"moe combine (epoch {epoch})")
        t = layout.tokens[me]
        out = torch.empty((t, h), dtype=dtype, device=dev)
        if t == 0:
            return out
        # where each destination's row of each token sits in this rank's buffer (-1: none)
        pos = torch.full((w, t), -1, dtype=torch.int32, device=dev)
        at = 0
        for r in range(w):
            n = counts[me][r]
            if n:
                pos[r, layout.send_tokens[r].to(dev)] = torch.arange(
                    at, at + n, dtype=torch.int32, device=dev)
            at += n
        if st.interpret:
            bt, bh = 8, 32
        else:
            bt, bh = st.k.SUM_BLOCKS_GPU
        grid = (-(-t // bt), -(-h // bh))
        st.k.moe_combine_sum[grid](recv.view(dtype), pos, out, t, h, WORLD=w, BT=bt, BH=bh)
        return out

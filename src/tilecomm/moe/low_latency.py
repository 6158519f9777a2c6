"""Low-latency MoE dispatch/combine on the device: what the kernel engine keeps between calls
(:meth:`tilecomm.moe.kernel.KernelEngine.ll_dispatch` / ``ll_combine``; kernels
``moe_ll_dispatch_push`` / ``moe_ll_combine_push`` in
:mod:`tilecomm.backends.triton.kernels.moe`).

NOTE [low latency on the device]
    A decode step must not wait for the host: no handshake, no count exchange, no host read.
    A layer's first low-latency call agrees on M with the peers (``comm.exchange``; a rank
    that disagrees raises CommMismatch on every rank) and fixes it, as DeepEP fixes its
    buffer's token count; the buffers (any K, fp8 or not) are made then. Every later call is
    device work only: positions and counts per expert from torch ops on the device, one push
    kernel whose per-call epoch the host bumps *on the device* (``epoch.add_(1)``, so a
    captured CUDA graph replays with fresh epochs). With its counts each source writes its
    (fp8, K); outside CUDA graph capture the receiver reads them after the kernel (as
    ``heap.check`` reads the error word, the one host read) and raises CommMismatch if a
    source differs, or ValueError if a source refused its call (count -1: a rank with bad
    arguments still runs the kernel with no rows, so the epochs stay in step and every rank
    fails the call). Under capture nothing is read: a refusing source's rows are absent.
    Halves alternate by this rank's call count (a captured step replays one half: its
    result is then valid until this rank's combine, which is when a decode step is done with
    it); a peer can write a half again only after this rank's next dispatch started.
"""

from __future__ import annotations

import torch

from ..agree import compare
from ..errors import CommMismatch

#: symmetric buffers and their parts start at this many bytes (also the kernel engine's)
ALIGN = 256


def round_up(n: int, a: int = ALIGN) -> int:
    """``n`` rounded up to a multiple of ``a``."""
    return -(-n // a) * a


class LowLatency:
    """What combine needs of one device low-latency dispatch (``Dispatched.layout.extra``):
    this rank's ``valid/dest/flat/weights [T, K]`` and the dispatch's receive counts."""

    def __init__(self, bufs, m, k, tokens, valid, dest, flat, weights, recv_cnt):
        self.bufs, self.m, self.k, self.tokens = bufs, m, k, tokens
        self.valid, self.dest, self.flat, self.weights = valid, dest, flat, weights
        self.recv_cnt = recv_cnt


#: words per source after the counts in ``recv_cnt``: the source's (fp8, K) for this call
DESC_WORDS = 2
#: first value of the exchange that fixes a layer's M ("LLM" in ASCII)
_AGREE_TAG = 0x4C4C4D


class _LowLatencyBuffers:
    """Fixed symmetric buffers, pads and device epochs of the low-latency kernels for one
    layer shape (E, H, dtype) and M; sized for fp8 or not, any K. Created collectively."""

    def __init__(self, st, w: int, el: int, m: int, row_bytes: int, meta_words: int):
        heap = st.heap
        self.meta_words = meta_words
        self.x_bytes = round_up(el * w * m * row_bytes)          # fp8 rows use the front of it
        self.meta_bytes = round_up(el * w * m * meta_words * 4)
        cnt_bytes = round_up((el + DESC_WORDS) * w * 8)
        self.half_bytes = self.x_bytes + self.meta_bytes + cnt_bytes
        self.comb_half = round_up(el * w * m * row_bytes)
        self.recv = heap.alloc(2 * self.half_bytes, torch.uint8)
        self.comb = heap.alloc(2 * self.comb_half, torch.uint8)
        self.pads = {op: heap.signal_pad(st.programs * w) for op in ("dispatch", "combine")}
        dev = self.recv.device
        self.epochs = {op: torch.zeros(1, dtype=torch.int64, device=dev)
                       for op in ("dispatch", "combine")}
        self.calls = {"dispatch": 0, "combine": 0}

    def parts(self, half: int):
        """``(recv_x, recv_meta, recv_cnt)`` of dispatch half ``half`` (uint8 views)."""
        base = half * self.half_bytes
        x = self.recv[base:base + self.x_bytes]
        meta = self.recv[base + self.x_bytes:base + self.x_bytes + self.meta_bytes]
        cnt = self.recv[base + self.x_bytes + self.meta_bytes:base + self.half_bytes]
        return x, meta, cnt


def capturing(device: torch.device) -> bool:
    """Whether work on ``device`` is being captured into a CUDA graph (no host reads then)."""
    return device.type == "cuda" and torch.cuda.is_current_stream_capturing()


def meta_words(hidden: int) -> int:
    """int32 words per slot: the token index (int64) and, for fp8 rows, a scale per 128
    channels (room for them whenever ``hidden`` allows fp8), padded to 16 bytes."""
    return round_up(2 + (hidden // 128 if hidden % 128 == 0 else 0), 4)


def ll_buffers(engine, ep, m: int) -> _LowLatencyBuffers:
    """The buffers of ``ep``'s low-latency calls. Its first call agrees on ``m`` with the
    peers (collective: CommMismatch on every rank if they differ) and fixes it for the
    layer; layers of one shape and M share buffers (their calls alternate, each dispatch
    followed by its combine). Later calls find them without any host exchange."""
    st, comm = engine.st, engine.comm
    if ep.ll_max_tokens is None:
        # a length and tag of its own: paired with another layer call's exchange (a rank
        # that made a different call) it is a mismatch, not a misread
        descs = comm.exchange([_AGREE_TAG, m, ep.num_experts, ep.hidden, ep.itemsize])
        if any(d[0] != _AGREE_TAG for d in descs):
            raise CommMismatch("moe low-latency dispatch: ranks made different calls (a "
                               "layer's first low-latency dispatch on some, not on others)")
        compare("moe low-latency dispatch", descs,
                [(1, "max_tokens_per_rank (fixed by a layer's first low-latency call)", str)])
        ep.ll_max_tokens = m
    key = (ep.ll_max_tokens, ep.num_experts, ep.hidden, ep.itemsize)
    bufs = st.ll.get(key)
    if bufs is None:
        bufs = st.ll[key] = _LowLatencyBuffers(st, comm.world_size, ep.el, ep.ll_max_tokens,
                                               ep.hidden * ep.itemsize, meta_words(ep.hidden))
    return bufs


def ll_positions(idx: torch.Tensor, num_experts: int):
    """Per (token, k): ``valid`` (an expert in ``[0, E)``), the expert ``e`` (E where not
    valid), ``pos`` (the token's place among this rank's tokens for ``e``, in token order) and
    per expert the count ``[E]``; torch ops on ``idx``'s device, no host read."""
    t, k = idx.shape
    valid = (idx >= 0) & (idx < num_experts)
    e = torch.where(valid, idx, num_experts)
    onehot = torch.zeros((t, num_experts + 1), dtype=torch.int64, device=idx.device)
    onehot.scatter_(1, e, 1)        # one expert per row at most once (check_topk)
    before = onehot.cumsum(0) - onehot
    pos = before.gather(1, e)
    return valid, e, pos, onehot[:, :num_experts].sum(0)

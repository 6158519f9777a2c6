"""Receives posted at expect time, for a request whose one sender is on another host.

NOTE [receives posted at expect]
    Gloo moves a message only once its receive is posted (the receiver's "ready" travels to
    the sender first), and posting takes the connection's lock, which its I/O thread holds
    while it reads. Receives posted as each PUSH arrived therefore trickled out one at a
    time while earlier data flowed, and the link idled between messages: 0.51-0.71 of a bare
    Gloo stream of the same bytes. A request with one sender on another host knows where
    all its bytes land at ``expect``: its blocks, every layer, K and V. So the receiver posts
    every receive then, one message per (layer, K/V, run of consecutive destination blocks),
    with tags it chose (``base`` in the EXPECT), and the sender sends exactly those
    messages, in the receiver's block layout (straight from its cache where its own blocks
    are consecutive too and all heads move, else gathered), and a PUSH with no tags that
    names the layers: a layer counts as landed only with both its data and that word.

    The price is an obligation: a posted receive cannot be withdrawn, so the sender sends
    every message of such a request even when it ends early (failed, cancelled, stalled,
    closed): the layers it did not push go as zeros (``KVTransfer._drop_expectation``), with
    no PUSH word, so they never complete the request (the data may land before the notice
    that ends it: they travel on different connections), and the receiver keeps the
    request's blocks held (``expect`` refuses them; ``ExpectHandle.blocks_free`` says when
    they are free) until the last of its messages landed or the sender's host is gone. A sender that never makes another kv call leaves those blocks
    held.

Only CPU caches: an NCCL receive posted early would hold the pair's stream, and the sends
queued behind it on that stream, until its data came.
"""

from __future__ import annotations

import torch

from .handles import DATA_TAG0, TAG_SPAN
from .schedule import CacheGeometry, HeadSplit, Run, coalesce

#: tags of posted receives: above the senders' own (handles.DATA_TAG0 .. + TAG_SPAN)
PREPOST_TAG0 = DATA_TAG0 + TAG_SPAN
PREPOST_SPAN = TAG_SPAN


def dst_runs(dst_ids: list[int]) -> list[Run]:
    """Runs of consecutive destination blocks: one message per (layer, K/V, run)."""
    return coalesce(dst_ids, dst_ids)


def tag(base: int, layer: int, kv: int, nruns: int, k: int) -> int:
    """The tag of run ``k`` of (``layer``, ``kv``) of a request whose tags start at ``base``."""
    return PREPOST_TAG0 + (base + (layer * 2 + kv) * nruns + k) % PREPOST_SPAN


def messages(layers: int, nruns: int) -> int:
    return layers * 2 * nruns


class Plan:
    """How the sender cuts a request's messages: per run of consecutive destination blocks,
    its source blocks as a range (consecutive) or a list (gathered). Made once per request
    and reused by every layer's push."""

    def __init__(self, src_ids: list[int], dst_ids: list[int]):
        self.spans: list = []
        at = 0
        for r in dst_runs(dst_ids):
            s = src_ids[at:at + r.n]
            self.spans.append((s[0], s[0] + r.n) if s == list(range(s[0], s[0] + r.n)) else s)
            at += r.n

    def pieces(self, cache: torch.Tensor, layers: range, hs: HeadSplit, whole: bool):
        """The messages of ``layers``: ``(layer, kv, k, tensor)`` in the receiver's block
        layout (a view of ``cache`` where the source blocks are consecutive and all heads
        move, else a gathered copy)."""
        for layer in layers:
            for kv in (0, 1):
                for k, sp in enumerate(self.spans):
                    a = cache[layer, kv, sp[0]:sp[1]] if isinstance(sp, tuple) else \
                        cache[layer, kv, sp]
                    if not whole:
                        a = a[:, :, hs.src:hs.src + hs.count]
                    yield layer, kv, k, a.contiguous()


def run_bytes(dst: CacheGeometry, dst_ids: list[int]) -> list[int]:
    """Bytes of each run's message (the receiver's blocks, all its heads)."""
    return [r.n * dst.block_bytes for r in dst_runs(dst_ids)]

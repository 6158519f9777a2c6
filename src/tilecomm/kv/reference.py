"""The slow, obviously correct reference of a KV transfer: block by block, layer by layer."""

from __future__ import annotations

import torch


def reference_transfer(src_cache: torch.Tensor, dst_cache: torch.Tensor, src_ids, dst_ids,
                       layers=None, head_split=None) -> torch.Tensor:
    """``dst_cache`` (a copy) after moving ``src_ids[i]`` -> ``dst_ids[i]`` for ``layers``.

    Caches are ``[L, 2, B, S, H, D]``; ``head_split=(src_head, dst_head, count)`` or None (all
    heads). One indexing per (layer, K/V, block): no runs, no views shared with the engine.
    """
    out = dst_cache.clone()
    layers = range(src_cache.shape[0]) if layers is None else layers
    hs, hd, n = head_split if head_split is not None else (0, 0, src_cache.shape[4])
    for layer in layers:
        for kv in range(2):
            for s, d in zip(src_ids, dst_ids):
                out[layer, kv, int(d), :, hd:hd + n] = src_cache[layer, kv, int(s), :, hs:hs + n]
    return out

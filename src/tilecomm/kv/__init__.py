"""KV-cache transfer for disaggregated serving (prefill ranks -> decode ranks).

>>> kv = KVTransfer(comm)
>>> cache = kv.paged_cache(num_layers=L, num_blocks=B, block_size=S, kv_heads=H, head_dim=D)
>>> h = kv.expect("req-7", src=0, block_ids=[3, 4, 5])          # decode rank
>>> kv.push("req-7", dst=1, block_ids=[10, 11, 12], layers=range(0, 4))   # prefill rank
>>> h.layer_ready(0); h.wait()

Caches on CPU (shared memory) or CUDA (``device="cuda"``: a CUDA IPC heap); inside a host a
push moves by the Triton copy kernel or by copies (``path=``, :mod:`tilecomm.kv.paths`),
across hosts by messages (Gloo, NCCL for CUDA caches). Every request has a deadline
(``expect(..., deadline=)``), after which it ends on both sides (:class:`KVStalled`).

See :mod:`tilecomm.kv.transfer` for the protocol and :mod:`tilecomm.kv.schedule` for what a
request moves (the same list the performance model times).
"""

from .handles import KVStalled
from .paths import PathChooser
from .schedule import CACHE_DTYPES, CacheGeometry, HeadSplit, Run, Transfer, coalesce, transfers
from .transfer import ExpectHandle, KVTransfer, PushHandle
from .reference import reference_transfer

__all__ = ["KVTransfer", "ExpectHandle", "PushHandle", "KVStalled", "PathChooser",
           "CacheGeometry", "HeadSplit", "Run", "Transfer", "CACHE_DTYPES", "coalesce",
           "transfers", "reference_transfer"]

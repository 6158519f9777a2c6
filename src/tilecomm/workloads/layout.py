"""Parallel layouts: validation against a model and a cluster, and group placement.

Rank order is Megatron-LM's default (``tp-cp-ep-dp-pp``, fastest first): rank
``r = t + tp*(c + cp*(d + dp*p))``. Tensor parallelism is innermost so TP groups fill an NVLink
domain first; then context, expert (carved out of the cp*dp ranks) and data parallelism;
pipeline stages outermost, so neighbouring stages are the farthest apart and exchange the least.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace

from .comm import Placement, place
from .models import ModelSpec

RECOMPUTE = ("none", "selective", "full")


@dataclass(frozen=True)
class Layout:
    """A parallel layout. ``tp*cp*dp*pp`` = GPUs; ``ep`` divides ``cp*dp`` (experts are
    spread over data/context-parallel ranks, Megatron's expert-model-parallel group).

    ``vpp``: model chunks per pipeline rank (interleaved 1F1B; 1 = plain 1F1B).
    ``zero``: 0 replicated, 1 optimizer state sharded (distributed optimizer), 2 + gradients,
    3 + weights (FSDP: weights gathered per micro-batch). ``sp``: sequence parallelism with TP.
    ``tp_overlap``: TP collectives overlapped with the neighbouring GEMMs.
    ``ep_overlap``: EP dispatch/combine all_to_all hidden behind another micro-batch's compute
    (DeepSeek-V3's DualPipe, Megatron-core's overlapped MoE all-to-all).
    ``dp_overlap``: gradient buckets reduced during backward (and ZeRO weight gathers during
    forward). ``recompute``: activation recomputation none | selective | full.
    """

    tp: int = 1
    pp: int = 1
    dp: int = 1
    cp: int = 1
    ep: int = 1
    vpp: int = 1
    zero: int = 1
    sp: bool = False
    tp_overlap: bool = False
    ep_overlap: bool = False
    dp_overlap: bool = True
    recompute: str = "none"

    @property
    def gpus(self) -> int:
        return self.tp * self.pp * self.dp * self.cp

    def short(self) -> str:
        s = f"TP{self.tp} PP{self.pp} DP{self.dp}"
        if self.cp > 1:
            s += f" CP{self.cp}"
        if self.ep > 1:
            s += f" EP{self.ep}"
        if self.vpp > 1:
            s += f" v{self.vpp}"
        return s

    def as_dict(self) -> dict:
        return asdict(self)

    def with_(self, **kw) -> Layout:
        return replace(self, **kw)


def validate(layout: Layout, model: ModelSpec, gpus: int, gpus_per_node: int,
             seq: int | None = None) -> None:
    """ValueError naming the first constraint ``layout`` breaks for ``model`` on ``gpus``."""
    L = layout
    for k in ("tp", "pp", "dp", "cp", "ep", "vpp"):
        v = getattr(L, k)
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ValueError(f"{k} must be a positive integer, got {v!r}")
    if L.gpus != gpus:
        raise ValueError(f"tp*pp*dp*cp = {L.tp}*{L.pp}*{L.dp}*{L.cp} = {L.gpus} does not equal "
                         f"the {gpus} GPUs")
    if L.zero not in (0, 1, 2, 3):
        raise ValueError(f"zero must be 0, 1, 2 or 3, got {L.zero!r}")
    if L.recompute not in RECOMPUTE:
        raise ValueError(f"recompute must be one of {', '.join(RECOMPUTE)}, got {L.recompute!r}")
    if L.tp > gpus_per_node:
        raise ValueError(f"tp={L.tp} exceeds the {gpus_per_node} GPUs of one NVLink domain; "
                         "TP across nodes is not modeled")
    if gpus_per_node % L.tp:
        raise ValueError(f"tp={L.tp} must divide the {gpus_per_node} GPUs per node")
    if model.heads % L.tp:
        raise ValueError(f"tp={L.tp} must divide the {model.heads} attention heads")
    if not model.mla and model.kv_heads % L.tp and L.tp % model.kv_heads:
        raise ValueError(f"tp={L.tp} and the {model.kv_heads} KV heads must divide one another")
    if L.pp * L.vpp > model.layers:
        raise ValueError(f"pp*vpp = {L.pp * L.vpp} exceeds the {model.layers} layers")
    if L.vpp > 1 and L.pp == 1:
        raise ValueError("vpp > 1 (interleaved schedule) needs pp > 1")
    if L.ep > 1:
        if not model.is_moe:
            raise ValueError(f"ep={L.ep} needs an MoE model; {model.name} is dense")
        if model.experts % L.ep:
            raise ValueError(f"ep={L.ep} must divide the {model.experts} experts")
        if (L.cp * L.dp) % L.ep:
            raise ValueError(f"ep={L.ep} must divide cp*dp = {L.cp * L.dp} (experts are spread "
                             "over data/context-parallel ranks)")
    if L.ep_overlap and L.ep == 1:
        raise ValueError("ep_overlap needs ep > 1")
    if L.sp and L.tp == 1:
        raise ValueError("sequence parallelism (sp) needs tp > 1")
    if L.tp_overlap and not L.sp:
        raise ValueError("tp_overlap needs sequence parallelism (sp), as in Megatron-LM")
    if seq is not None and L.cp > 1 and seq % (2 * L.cp):
        raise ValueError(f"seq={seq} must be a multiple of 2*cp = {2 * L.cp} (load-balanced "
                         "causal context parallelism)")
    if gpus > gpus_per_node and gpus % gpus_per_node:
        raise ValueError(f"{gpus} GPUs is not a whole number of {gpus_per_node}-GPU nodes")


@dataclass(frozen=True)
class Groups:
    """Placement of each parallelism's group (see :func:`tilecomm.workloads.comm.place`)."""

    tp: Placement
    cp: Placement
    ep: Placement
    dp: Placement        # dense-weight gradient group: dp*cp ranks
    edp: Placement       # expert-weight gradient group: dp*cp/ep ranks
    pp_cross_node: bool  # do neighbouring stages sit on different nodes?

    def as_dict(self) -> dict:
        d = {k: getattr(self, k).describe() for k in ("tp", "cp", "ep", "dp", "edp")}
        d["pp"] = "stage neighbours on different nodes" if self.pp_cross_node else \
            "stage neighbours in one node"
        return d


def groups(layout: Layout, gpus_per_node: int) -> Groups:
    """Where each group sits under the ``tp-cp-ep-dp-pp`` rank order and block placement.

    The gradient group of dense weights is the dp*cp ranks sharing a (tp, pp) coordinate,
    stride tp (CP ranks hold the same weights); expert weights are reduced over the
    dp*cp/ep ranks that hold the same experts, stride tp*ep.
    """
    L, G = layout, gpus_per_node
    return Groups(
        tp=place(L.tp, 1, G),
        cp=place(L.cp, L.tp, G),
        ep=place(L.ep, L.tp, G),
        dp=place(L.dp * L.cp, L.tp, G),
        edp=place(L.dp * L.cp // L.ep, L.tp * L.ep, G),
        pp_cross_node=L.tp * L.cp * L.dp >= G,
    )

"""Model descriptions: dense and MoE transformers from their hyperparameters.

Parameter counts are exact for the architectures' weight matrices (embeddings, attention,
FFN or experts and router, norms, biases where the model has them). FLOPs per token count one
multiply-add as 2 FLOPs, for the matrix multiplies of the *active* parameters (the input
embedding is a lookup, no FLOPs) plus attention's score and value products.

Presets and their sources (published configs):

* Llama-3 8B / 70B / 405B: Meta's model cards and ``params.json`` (Dubey et al. 2024, "The Llama 3
  Herd of Models", Table 3): 32/80/126 layers, hidden 4096/8192/16384, FFN 14336/28672/53248,
  32/64/128 heads, 8 KV heads, vocabulary 128,256. Published totals 8.0B / 70.6B / 405B.
* GPT-3 175B: Brown et al. 2020, Table 2.1: 96 layers, d_model 12288, 96 heads, FFN 4*d, 2048
  context, vocabulary 50,257, learned positions, tied embeddings, biases. Published 175.0B.
* Mixtral 8x7B: Jiang et al. 2024 (arXiv 2401.04088) Table 1: 32 layers, 4096, FFN 14336, 32
  heads, 8 KV heads, 8 experts, top-2, vocabulary 32,000. Published 46.7B total / 12.9B active.
* Llama 2 7B / 13B / 70B: Touvron et al. 2023, Table 1 and params.json: 32/40/80 layers, hidden
  4096/5120/8192, FFN 11008/13824/28672, 32/40/64 heads (70B: 8 KV heads), vocabulary 32,000.
  Published 6.7B / 13.0B / 69.0B.
* Qwen3-30B-A3B / 235B-A22B: config.json: 48/94 layers, hidden 2048/4096, 32/64 heads of 128
  (4 KV heads), 128 experts of FFN 768/1536, top-8, vocabulary 151,936 (the per-head q/k norms
  are left out). Published 30.5B / 3.3B active and 235B / 22B active.
* GPT-OSS-120B: config.json: 36 layers, hidden 2880, 64 heads of 64 (8 KV heads), biases, 128
  experts of FFN 2880, top-4, vocabulary 201,088, every other layer a 128-token sliding window
  (attention sinks left out). Published 116.8B total / 5.1B active.
* DeepSeek-V3: DeepSeek-AI 2024 (arXiv 2412.19437) and its ``config.json``: 61 layers (first 3
  dense, FFN 18432), hidden 7168, 128 heads, MLA (q_lora_rank 1536, kv_lora_rank 512, head dims
  nope 128 + rope 64, v 128), 256 routed experts of FFN 2048 + 1 shared, top-8, vocabulary
  129,280. Published 671B total / 37B active (main model, without the 14B MTP module).
"""

from __future__ import annotations

import json
from dataclasses import MISSING, asdict, dataclass, fields
from pathlib import Path


@dataclass(frozen=True)
class ModelSpec:
    """A decoder-only transformer. Sizes are element counts; ``ffn`` is the dense FFN's
    intermediate size, ``moe_ffn`` one expert's (0: same as ``ffn``)."""

    name: str
    layers: int
    hidden: int
    heads: int
    kv_heads: int
    ffn: int
    vocab: int
    head_dim: int = 0            # 0: hidden // heads
    gated_ffn: bool = True       # SwiGLU (3 matrices) or GELU (2)
    tied_embeddings: bool = False
    bias: bool = False           # linear-layer and norm biases (GPT-3)
    learned_positions: int = 0   # learned position-embedding rows (GPT-3: 2048)
    experts: int = 0             # routed experts per MoE layer (0: dense model)
    top_k: int = 0
    shared_experts: int = 0
    moe_ffn: int = 0
    dense_layers: int = 0        # leading layers with a dense FFN in an MoE model
    q_lora_rank: int = 0         # MLA (DeepSeek): 0 = no query compression
    kv_lora_rank: int = 0        # MLA: > 0 turns MLA on
    rope_head_dim: int = 0       # MLA: decoupled RoPE dims per head
    v_head_dim: int = 0          # MLA: value head dim (0: head_dim)
    dropout: bool = False        # hidden/attention dropout in training (stores two masks/layer)
    sliding_window: int = 0      # keys a sliding-window layer attends to (0: none)
    sliding_layers: int = 0      # how many layers use the sliding window (GPT-OSS: every other)
    source: str = ""

    def __post_init__(self):
        if not isinstance(self.name, str) or not self.name:
            raise ValueError(f"model name must be a non-empty string, got {self.name!r}")
        where = f"model {self.name!r}: "
        for f in fields(self):
            v = getattr(self, f.name)
            if f.type == "int" and (isinstance(v, bool) or not isinstance(v, int)):
                raise ValueError(f"{where}{f.name} must be an integer, got {v!r}")
            if f.type == "bool" and not isinstance(v, bool):
                raise ValueError(f"{where}{f.name} must be true or false, got {v!r}")
            if f.type == "str" and not isinstance(v, str):
                raise ValueError(f"{where}{f.name} must be a string, got {v!r}")
            lo = 1 if f.name in ("layers", "hidden", "heads", "kv_heads", "ffn", "vocab") else 0
            if f.type == "int" and v < lo:
                raise ValueError(f"{where}{f.name} must be >= {lo}, got {v}")
        if self.heads % self.kv_heads:
            raise ValueError(f"{where}heads ({self.heads}) must be a multiple of kv_heads "
                             f"({self.kv_heads})")
        if not self.head_dim and self.hidden % self.heads:
            raise ValueError(f"{where}hidden ({self.hidden}) must be a multiple of heads "
                             f"({self.heads}) unless head_dim is given")
        if self.experts:
            if not 1 <= self.top_k <= self.experts:
                raise ValueError(f"{where}top_k must be in 1..experts ({self.experts}), "
                                 f"got {self.top_k}")
            if not 0 <= self.dense_layers < self.layers:
                raise ValueError(f"{where}dense_layers must be in 0..layers-1, "
                                 f"got {self.dense_layers}")
        elif self.top_k or self.shared_experts or self.dense_layers:
            raise ValueError(f"{where}top_k, shared_experts and dense_layers need experts > 0")
        if self.sliding_layers > self.layers or (self.sliding_layers > 0) != (
                self.sliding_window > 0):
            raise ValueError(f"{where}sliding_layers must be in 0..layers and given together "
                             "with sliding_window")

    # -- shapes ----------------------------------------------------------------------------
    @property
    def hd(self) -> int:
        """Per-head dimension of queries/keys (without MLA's RoPE part)."""
        return self.head_dim or self.hidden // self.heads

    @property
    def vd(self) -> int:
        return self.v_head_dim or self.hd

    @property
    def mla(self) -> bool:
        return self.kv_lora_rank > 0

    @property
    def is_moe(self) -> bool:
        return self.experts > 0

    @property
    def moe_layers(self) -> int:
        return self.layers - self.dense_layers if self.is_moe else 0

    @property
    def expert_ffn(self) -> int:
        return self.moe_ffn or self.ffn

    # -- parameters per piece ----------------------------------------------------------------
    def attn_params(self) -> int:
        """Attention weights of one layer (plus biases if ``bias``)."""
        h, nh, d = self.hidden, self.heads, self.hd
        if self.mla:
            qd = nh * (d + self.rope_head_dim)
            q = (h * self.q_lora_rank + self.q_lora_rank + self.q_lora_rank * qd
                 if self.q_lora_rank else h * qd)
            kv = (h * (self.kv_lora_rank + self.rope_head_dim) + self.kv_lora_rank +
                  self.kv_lora_rank * nh * (d + self.vd))
            return q + kv + nh * self.vd * h
        qkv = h * (nh + 2 * self.kv_heads) * d
        out = nh * d * h
        b = (nh + 2 * self.kv_heads) * d + h if self.bias else 0
        return qkv + out + b

    def mlp_params(self, inter: int) -> int:
        """One FFN (or expert) of intermediate size ``inter``."""
        mats = 3 if self.gated_ffn else 2
        b = (inter + self.hidden) if self.bias else 0
        return mats * self.hidden * inter + b

    def norm_params(self) -> int:
        """Two norms per layer (weight, plus bias for LayerNorm with biases)."""
        return 2 * self.hidden * (2 if self.bias else 1)

    def embedding_params(self) -> int:
        """Input embedding, output head (unless tied), positions, final norm."""
        e = self.vocab * self.hidden * (1 if self.tied_embeddings else 2)
        return e + self.learned_positions * self.hidden + self.hidden * (2 if self.bias else 1)

    def dense_layer_params(self) -> int:
        return self.attn_params() + self.mlp_params(self.ffn) + self.norm_params()

    def moe_layer_params(self, active: bool = False) -> int:
        """One MoE layer: attention, router, shared experts, routed (all or top_k) experts."""
        routed = self.top_k if active else self.experts
        return (self.attn_params() + self.norm_params() + self.hidden * self.experts +
                (self.shared_experts + routed) * self.mlp_params(self.expert_ffn))

    def expert_params_per_layer(self) -> int:
        """Routed-expert weights of one MoE layer (the part sharded by expert parallelism)."""
        return self.experts * self.mlp_params(self.expert_ffn)

    def total_params(self) -> int:
        """All weights (published 'total parameters')."""
        dense = (self.layers - self.moe_layers) * self.dense_layer_params()
        return dense + self.moe_layers * self.moe_layer_params() + self.embedding_params()

    def active_params(self) -> int:
        """Weights one token uses (MoE: top_k routed + shared experts)."""
        dense = (self.layers - self.moe_layers) * self.dense_layer_params()
        return (dense + self.moe_layers * self.moe_layer_params(active=True) +
                self.embedding_params())

    # -- FLOPs ---------------------------------------------------------------------------------
    def matmul_flops_per_token(self) -> float:
        """Forward FLOPs of the weight matmuls for one token: 2 x active weights used in a
        matmul (the output head counts; the input embedding lookup and positions do not)."""
        lookup = self.vocab * self.hidden if not self.tied_embeddings else 0
        n = self.active_params() - lookup - self.learned_positions * self.hidden
        return 2.0 * n

    def attn_flops_per_token(self, seq: int, causal: bool = False) -> float:
        """Forward FLOPs of QK^T and AV for one token at context ``seq`` (all layers).

        ``causal=False`` counts the full s x s products, as Megatron-LM's and PaLM's FLOPs
        formulas do; ``causal=True`` halves them (what a causal flash-attention kernel runs).
        Sliding-window layers see at most ``sliding_window`` keys.
        """
        qk = self.hd + (self.rope_head_dim if self.mla else 0)
        per_key = 2.0 * self.heads * (qk + self.vd)
        full = self.layers - self.sliding_layers
        f = per_key * seq * full / (2 if causal else 1)
        if self.sliding_layers:
            # a token at position i sees min(i, w) keys: w - w^2/(2 s) on average over the
            # sequence (x2 in the full-s^2 convention, as for the other layers)
            w = min(self.sliding_window, seq)
            f += per_key * (w - w * w / (2 * seq)) * self.sliding_layers * (1 if causal else 2)
        return f

    def fwd_flops_per_token(self, seq: int, causal: bool = False) -> float:
        return self.matmul_flops_per_token() + self.attn_flops_per_token(seq, causal)

    # -- KV cache ------------------------------------------------------------------------------
    def kv_bytes_per_token(self, elem_bytes: float = 2.0) -> float:
        """KV-cache bytes per token over all layers (MLA caches the compressed latent)."""
        per_layer = (self.kv_lora_rank + self.rope_head_dim if self.mla else
                     2 * self.kv_heads * self.hd)
        return per_layer * self.layers * elem_bytes

    def as_dict(self) -> dict:
        return asdict(self)


def _llama3(name, layers, hidden, heads, ffn, src):
    return ModelSpec(name, layers, hidden, heads, 8, ffn, 128256, source=src)


L3 = "Dubey et al. 2024, The Llama 3 Herd of Models, Table 3; Meta params.json"
L2 = "Touvron et al. 2023, Llama 2 (arXiv 2307.09288); Meta params.json"
QWEN3 = "Qwen3 Technical Report (arXiv 2505.09388) and the models' config.json"
GPTOSS = "OpenAI 2025, gpt-oss-120b model card and config.json"
PRESETS: dict[str, ModelSpec] = {
    "llama3-8b": _llama3("llama3-8b", 32, 4096, 32, 14336, L3),
    "llama3-70b": _llama3("llama3-70b", 80, 8192, 64, 28672, L3),
    "llama3-405b": _llama3("llama3-405b", 126, 16384, 128, 53248, L3),
    "gpt3-175b": ModelSpec("gpt3-175b", 96, 12288, 96, 96, 4 * 12288, 50257, gated_ffn=False,
                           tied_embeddings=True, bias=True, learned_positions=2048,
                           dropout=True,
                           source="Brown et al. 2020, Language Models are Few-Shot Learners, "
                                  "Table 2.1"),
    "llama2-7b": ModelSpec("llama2-7b", 32, 4096, 32, 32, 11008, 32000, source=L2),
    "llama2-13b": ModelSpec("llama2-13b", 40, 5120, 40, 40, 13824, 32000, source=L2),
    "llama2-70b": ModelSpec("llama2-70b", 80, 8192, 64, 8, 28672, 32000, source=L2),
    "qwen3-30b-a3b": ModelSpec("qwen3-30b-a3b", 48, 2048, 32, 4, 6144, 151936, head_dim=128,
                               experts=128, top_k=8, moe_ffn=768, source=QWEN3),
    "qwen3-235b-a22b": ModelSpec("qwen3-235b-a22b", 94, 4096, 64, 4, 12288, 151936,
                                 head_dim=128, experts=128, top_k=8, moe_ffn=1536,
                                 source=QWEN3),
    "gpt-oss-120b": ModelSpec("gpt-oss-120b", 36, 2880, 64, 8, 2880, 201088, head_dim=64,
                              bias=True, experts=128, top_k=4, sliding_window=128,
                              sliding_layers=18, source=GPTOSS),
    "mixtral-8x7b": ModelSpec("mixtral-8x7b", 32, 4096, 32, 8, 14336, 32000, experts=8,
                              top_k=2, source="Jiang et al. 2024, Mixtral of Experts, Table 1"),
    "deepseek-v3": ModelSpec("deepseek-v3", 61, 7168, 128, 128, 18432, 129280, head_dim=128,
                             experts=256, top_k=8, shared_experts=1, moe_ffn=2048,
                             dense_layers=3, q_lora_rank=1536, kv_lora_rank=512,
                             rope_head_dim=64, v_head_dim=128,
                             source="DeepSeek-AI 2024, DeepSeek-V3 Technical Report; "
                                    "config.json"),
}


def model_names() -> list[str]:
    return sorted(PRESETS)


def spec_from_dict(d: dict, where: str = "") -> ModelSpec:
    """A :class:`ModelSpec` from a JSON object; errors name the field and list the known ones."""
    if not isinstance(d, dict):
        raise ValueError(f"{where}a model description must be a JSON object")
    known = {f.name for f in fields(ModelSpec)}
    unknown = sorted(set(d) - known)
    if unknown:
        raise ValueError(f"{where}unknown field(s) {', '.join(unknown)}; "
                         f"fields: {', '.join(sorted(known))}")
    required = [f.name for f in fields(ModelSpec) if f.default is MISSING and f.name != "name"]
    missing = [k for k in required if k not in d]
    if missing:
        raise ValueError(f"{where}missing field(s) {', '.join(missing)}")
    try:
        return ModelSpec(**{"name": d.get("name", where.rstrip(": ") or "custom"), **d})
    except ValueError as e:
        raise ValueError(f"{where}{e}") from None


def load_model(name_or_path: str | ModelSpec) -> ModelSpec:
    """A preset by name or a ``.json`` file (see docs/model.md for the format)."""
    if isinstance(name_or_path, ModelSpec):
        return name_or_path
    key = name_or_path.lower()
    if key in PRESETS:
        return PRESETS[key]
    p = Path(name_or_path)
    if p.suffix == ".json":
        if not p.exists():
            raise FileNotFoundError(f"model file {name_or_path} not found")
        try:
            d = json.loads(p.read_text())
        except json.JSONDecodeError as e:
            raise ValueError(f"{p}: not valid JSON: {e}") from None
        if isinstance(d, dict):
            d.setdefault("name", p.stem)
        return spec_from_dict(d, f"{p}: ")
    raise ValueError(f"unknown model {name_or_path!r}; presets: {', '.join(model_names())}, "
                     "or a path to a model description .json")

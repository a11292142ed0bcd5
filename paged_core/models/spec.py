"""``DecoderSpec``: the sizes and switches of a decoder-only model, read off a Hugging Face
config by its family's file (``registry``). Plain data, no torch: the model, the
tensor-parallel split (``sharding.py``) and the engine's sizing all read it.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class MoeSpec:
    """A sparse mixture-of-experts MLP (``moe.py``): each token's ``top_k`` experts of
    ``num_experts``, each a gated MLP of width ``intermediate_size``."""

    num_experts: int
    top_k: int
    intermediate_size: int
    norm_top_k: bool  # renormalise the top-k probabilities to sum to 1
    float32_weights: bool  # routing weights stay float32 (Mixtral), else the model's dtype
    shared_expert_size: int = 0  # > 0: a gated dense expert every token runs (Qwen2-MoE)
    sparse_layers: tuple[bool, ...] = ()  # per layer: MoE (True) or a dense MLP


@dataclass(frozen=True)
class DecoderSpec:
    """What the model code needs to know about a checkpoint, whatever its family."""

    model_type: str
    num_layers: int
    hidden_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int  # dense MLP width (dense layers of an MoE model included)
    vocab_size: int
    rms_norm_eps: float
    qkv_bias: bool
    o_bias: bool
    mlp_bias: bool
    qk_norm: bool  # an RMSNorm over each head of q and k (Qwen3)
    tie_word_embeddings: bool
    sliding_windows: tuple[int | None, ...]  # one per layer
    qk_norm_over_heads: bool = False  # q/k norms over all heads at once (OLMoE)
    moe: MoeSpec | None = None

    def is_sparse(self, layer: int) -> bool:
        """True if ``layer``'s MLP is a mixture of experts."""
        return self.moe is not None and self.moe.sparse_layers[layer]


def sliding_windows(cfg) -> tuple[int | None, ...]:
    """The attention window of each layer (``None``: full attention), from ``sliding_window``
    and, where the config has them, ``layer_types`` / ``use_sliding_window``."""
    window = getattr(cfg, "sliding_window", None)
    layer_types = getattr(cfg, "layer_types", None)
    if hasattr(cfg, "use_sliding_window") and not cfg.use_sliding_window:
        window = None
    if layer_types:
        return tuple(window if t == "sliding_attention" else None for t in layer_types)
    return (window,) * cfg.num_hidden_layers


def long_rope_switch(cfg) -> int | None:
    """Where LongRoPE (Phi-3.5, Phi-4-mini) switches from its short to its long factors:
    ``original_max_position_embeddings``, else ``None`` (no LongRoPE).

    transformers rotates with the long factors in a forward that reaches past that length, and
    its Phi-3 ``generate`` drops its cache the first time a sequence grows past it, so that
    every key is computed again with them: a sequence longer than the switch holds only
    long-rotated keys, a shorter one only short-rotated ones. The engine core does the same
    (``EngineCore._rotate_long``). LongRoPE set per layer type is refused: no checkpoint has
    it."""
    params = getattr(cfg, "rope_parameters", None) or {}
    if any(isinstance(p, dict) and p.get("rope_type") == "longrope" for p in params.values()):
        raise ValueError(f"{cfg.model_type}: LongRoPE set per layer type is not supported")
    if params.get("rope_type") != "longrope":
        return None
    return int(params.get("original_max_position_embeddings",
                          getattr(cfg, "original_max_position_embeddings", None)))


def attention_shape(cfg) -> dict:
    """The fields every family reads the same way: layers, widths, heads, vocabulary."""
    heads = cfg.num_attention_heads
    return dict(
        model_type=cfg.model_type,
        num_layers=cfg.num_hidden_layers,
        hidden_size=cfg.hidden_size,
        num_heads=heads,
        num_kv_heads=getattr(cfg, "num_key_value_heads", None) or heads,
        head_dim=getattr(cfg, "head_dim", None) or cfg.hidden_size // heads,
        vocab_size=cfg.vocab_size,
        rms_norm_eps=cfg.rms_norm_eps,
        tie_word_embeddings=bool(getattr(cfg, "tie_word_embeddings", False)),
        sliding_windows=sliding_windows(cfg),
    )

"""``LlamaFamilySpec``: what differs between the Llama family's members (Llama, SmolLM,
Mistral, Qwen2, Qwen3, Phi-3), read off a Hugging Face config. Plain data, no torch: the
model (``llama.py``), the tensor-parallel split (``sharding.py``) and the engine's
sizing all read it.
"""
from __future__ import annotations

from dataclasses import dataclass

SUPPORTED_MODEL_TYPES = ("llama", "mistral", "qwen2", "qwen3", "phi3")


@dataclass(frozen=True)
class LlamaFamilySpec:
    """What differs between the family's members, read off a Hugging Face config."""

    num_layers: int
    hidden_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int
    rms_norm_eps: float
    qkv_bias: bool
    o_bias: bool
    mlp_bias: bool
    qk_norm: bool
    tie_word_embeddings: bool
    sliding_windows: tuple[int | None, ...]  # one per layer

    @classmethod
    def from_hf_config(cls, cfg) -> "LlamaFamilySpec":
        model_type = cfg.model_type
        if model_type not in SUPPORTED_MODEL_TYPES:
            raise ValueError(
                f"model_type {model_type!r} is not supported; supported: {SUPPORTED_MODEL_TYPES}")
        _refuse_unsupported_rope(cfg)
        attention_bias = bool(getattr(cfg, "attention_bias", False))
        heads = cfg.num_attention_heads
        return cls(
            num_layers=cfg.num_hidden_layers,
            hidden_size=cfg.hidden_size,
            num_heads=heads,
            num_kv_heads=getattr(cfg, "num_key_value_heads", None) or heads,
            head_dim=getattr(cfg, "head_dim", None) or cfg.hidden_size // heads,
            intermediate_size=cfg.intermediate_size,
            vocab_size=cfg.vocab_size,
            rms_norm_eps=cfg.rms_norm_eps,
            qkv_bias=attention_bias or model_type == "qwen2",
            o_bias=attention_bias and model_type == "llama",
            mlp_bias=bool(getattr(cfg, "mlp_bias", False)),
            qk_norm=model_type == "qwen3",
            tie_word_embeddings=bool(getattr(cfg, "tie_word_embeddings", False)),
            sliding_windows=_sliding_windows(cfg),
        )


def _refuse_unsupported_rope(cfg) -> None:
    """RoPE variants the static cos/sin tables (``layers.RotaryEmbedding``) cannot express yet:
    rotary over part of each head, and LongRoPE (its factors switch with the sequence length)."""
    params = getattr(cfg, "rope_parameters", None) or {}
    partial = params.get("partial_rotary_factor", getattr(cfg, "partial_rotary_factor", 1.0))
    if partial not in (None, 1, 1.0):
        raise ValueError(f"{cfg.model_type} with partial_rotary_factor={partial} is not supported "
                         f"yet (rotary over the whole head only)")
    if params.get("rope_type") == "longrope":
        raise ValueError(f"{cfg.model_type} with rope_type 'longrope' is not supported yet")


def _sliding_windows(cfg) -> tuple[int | None, ...]:
    window = getattr(cfg, "sliding_window", None)
    layer_types = getattr(cfg, "layer_types", None)
    if cfg.model_type in ("qwen2", "qwen3") and not getattr(cfg, "use_sliding_window", False):
        window = None
    if layer_types:
        return tuple(window if t == "sliding_attention" else None for t in layer_types)
    return (window,) * cfg.num_hidden_layers

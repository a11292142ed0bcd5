"""Gemma 2 and Gemma 3 (text): the Llama decoder with Gemma's differences.

- embeddings scaled by ``sqrt(hidden_size)`` (rounded to the model's dtype first);
- ``GemmaRMSNorm`` (``x / rms(x) * (1 + weight)`` in float32), before and after both the
  attention and the MLP (``post_attention_layernorm`` / ``post_feedforward_layernorm``
  norm the sublayer's output before the residual add);
- a GELU-tanh gated MLP (GeGLU);
- attention scaled by ``query_pre_attn_scalar ** -0.5``; Gemma 2 soft-caps its attention
  scores (``attn_logit_softcapping``) and its final logits (``final_logit_softcapping``):
  ``c * tanh(x / c)``; Gemma 3 norms q and k per head;
- ``layer_types`` alternate sliding-window and global layers; Gemma 3 gives each kind its
  own RoPE (``rope_parameters[layer_type]``: a local base, a global base with scaling).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from ..attention import AttentionBackend, AttentionMetadata
from ..executor.group import TensorParallelGroup
from .family import ModelFamily
from .layers import GemmaRMSNorm, RotaryEmbedding
from .llama import LlamaAttention, LlamaForCausalLM
from .mlp import GatedMLP
from .sharding import ShardPlan
from .spec import DecoderSpec, attention_shape


@dataclass(frozen=True)
class GemmaSpec(DecoderSpec):
    query_pre_attn_scalar: float = 1.0
    attn_logit_soft_cap: float | None = None
    final_logit_soft_cap: float | None = None
    layer_types: tuple[str, ...] = ()  # one per layer: "sliding_attention" or "full_attention"


def read_spec(cfg) -> GemmaSpec:
    if getattr(cfg, "hidden_activation", "gelu_pytorch_tanh") != "gelu_pytorch_tanh":
        raise ValueError(f"{cfg.model_type} with hidden_activation={cfg.hidden_activation!r} is "
                         f"not supported (gelu_pytorch_tanh only)")
    bias = bool(getattr(cfg, "attention_bias", False))
    gemma3 = cfg.model_type == "gemma3_text"
    return GemmaSpec(
        **attention_shape(cfg), intermediate_size=cfg.intermediate_size, qkv_bias=bias,
        o_bias=bias, mlp_bias=False, qk_norm=gemma3,
        query_pre_attn_scalar=cfg.query_pre_attn_scalar,
        attn_logit_soft_cap=getattr(cfg, "attn_logit_softcapping", None),
        final_logit_soft_cap=getattr(cfg, "final_logit_softcapping", None),
        layer_types=tuple(cfg.layer_types))


class GeluTanhMLP(GatedMLP):
    """``down(gelu_tanh(gate(x)) * up(x))``."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.gate_up_proj(x).chunk(2, dim=-1)
        return self.down_proj(F.gelu(gate, approximate="tanh") * up)


class GemmaAttention(LlamaAttention):
    def __init__(self, spec: GemmaSpec, shard: ShardPlan, tp: TensorParallelGroup,
                 sliding_window: int | None) -> None:
        super().__init__(spec, shard, tp, sliding_window)
        self.scale = spec.query_pre_attn_scalar ** -0.5
        self.logits_soft_cap = spec.attn_logit_soft_cap
        if spec.qk_norm:  # Gemma 3: per head, with Gemma's (1 + weight)
            self.q_norm = GemmaRMSNorm(spec.head_dim, spec.rms_norm_eps)
            self.k_norm = GemmaRMSNorm(spec.head_dim, spec.rms_norm_eps)


class GemmaDecoderLayer(nn.Module):
    def __init__(self, spec: GemmaSpec, shard: ShardPlan, tp: TensorParallelGroup,
                 layer_index: int) -> None:
        super().__init__()
        self.layer_type = spec.layer_types[layer_index]
        self.self_attn = GemmaAttention(spec, shard, tp, spec.sliding_windows[layer_index])
        self.mlp = GeluTanhMLP(spec.hidden_size, shard.intermediate_size, False, tp)
        size, eps = spec.hidden_size, spec.rms_norm_eps
        self.input_layernorm = GemmaRMSNorm(size, eps)
        self.post_attention_layernorm = GemmaRMSNorm(size, eps)
        self.pre_feedforward_layernorm = GemmaRMSNorm(size, eps)
        self.post_feedforward_layernorm = GemmaRMSNorm(size, eps)

    def forward(self, residual: torch.Tensor, rope: tuple[torch.Tensor, ...],
                kv_cache: tuple[torch.Tensor, torch.Tensor], meta: AttentionMetadata,
                backend: AttentionBackend) -> torch.Tensor:
        attn = self.self_attn(self.input_layernorm(residual), rope, kv_cache, meta, backend)
        residual = residual + self.post_attention_layernorm(attn)
        mlp = self.mlp(self.pre_feedforward_layernorm(residual))
        return residual + self.post_feedforward_layernorm(mlp)


class GemmaForCausalLM(LlamaForCausalLM):
    """Gemma 2 / Gemma 3 text over the Llama decoder's weights, loading and sharding."""

    layer_class = GemmaDecoderLayer
    norm_class = GemmaRMSNorm

    def attach_rotary(self, hf_config, max_positions: int, dtype: torch.dtype,
                      device: torch.device) -> None:
        """One cos/sin table per layer type (Gemma 3's differ; Gemma 2's are one RoPE)."""
        self.rotaries = {t: RotaryEmbedding(hf_config, max_positions, dtype, t).to(device)
                         for t in sorted(set(self.spec.layer_types))}
        self.rotary = self.rotaries[self.spec.layer_types[0]]

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor,
                kv_caches: list[tuple[torch.Tensor, torch.Tensor]], meta: AttentionMetadata,
                backend: AttentionBackend) -> torch.Tensor:
        embedded = self.embed_tokens(input_ids)  # scaled as transformers does: float32, then dtype
        residual = embedded * torch.tensor(self.spec.hidden_size ** 0.5).to(embedded.dtype)
        ropes = {t: self.ops.rope_tables(r, positions) for t, r in self.rotaries.items()}
        for layer, kv_cache in zip(self.layers, kv_caches):
            residual = layer(residual, ropes[layer.layer_type], kv_cache, meta, backend)
        return self.norm(residual)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor | None:
        logits = super().compute_logits(hidden)
        cap = self.spec.final_logit_soft_cap
        if logits is None or cap is None:
            return logits
        return torch.tanh(logits / cap) * cap


FAMILY = ModelFamily(
    name="Gemma", model_types=("gemma2", "gemma3_text"),
    architectures=("Gemma2ForCausalLM", "Gemma3ForCausalLM"), read_spec=read_spec,
    model_class=GemmaForCausalLM, tensor_parallel="yes",
    sliding_window="yes (alternating layer_types)",
    gguf="yes")

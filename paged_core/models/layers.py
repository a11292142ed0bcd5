"""Building blocks shared by the model files: RMSNorm (Llama's and Gemma's) and rotary
embeddings."""
from __future__ import annotations

import torch
from torch import nn

from .elementwise import TORCH_OPS


class RMSNorm(nn.Module):
    """Root-mean-square norm computed in float32, as Hugging Face's Llama does (see ``elementwise``)."""

    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps
        self.ops = TORCH_OPS

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.ops.rms_norm(x, self.weight, self.eps)

    def add_and_norm(self, residual: torch.Tensor,
                     x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``(residual + x, norm(residual + x))``; ``residual`` may be updated in place."""
        return self.ops.add_rms_norm(residual, x, self.weight, self.eps)


class GemmaRMSNorm(nn.Module):
    """Gemma's RMSNorm: ``x / rms(x) * (1 + weight)``, all in float32, rounded to ``x``'s dtype
    once at the end (Llama's rounds before multiplying by its weight)."""

    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = x.float()
        y = y * torch.rsqrt(y.pow(2).mean(-1, keepdim=True) + self.eps)
        return (y * (1.0 + self.weight.float())).type_as(x)


def partial_rotary_factor(hf_config, params: dict) -> float:
    """The fraction of each head that rotates (1: all of it; Phi-4-mini: 0.75)."""
    return params.get("partial_rotary_factor", getattr(hf_config, "partial_rotary_factor", None)
                      or 1.0)


def rope_inverse_frequencies(hf_config, layer_type: str | None = None) -> tuple[torch.Tensor, float]:
    """Inverse frequencies and attention scaling from ``config.rope_parameters``, or from its
    entry for ``layer_type`` where the config gives each kind of layer its own (Gemma 3:
    ``{"sliding_attention": {...}, "full_attention": {...}}``).

    Non-default RoPE types (llama3, linear, yarn, ...) reuse transformers' own
    initialisation functions so their maths stays identical to the reference.
    """
    every = getattr(hf_config, "rope_parameters", None) or {}
    per_type = layer_type is not None and layer_type in every
    params = every[layer_type] if per_type else every
    rope_type = params.get("rope_type", "default")
    if rope_type == "default":
        head_dim = getattr(hf_config, "head_dim", None) or (
            hf_config.hidden_size // hf_config.num_attention_heads)
        dim = int(head_dim * partial_rotary_factor(hf_config, params))
        base = params["rope_theta"]
        inv_freq = 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.float) / dim))
        return inv_freq, 1.0
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS
    if rope_type not in ROPE_INIT_FUNCTIONS:
        raise ValueError(f"unsupported rope_type {rope_type!r}")
    return ROPE_INIT_FUNCTIONS[rope_type](hf_config, torch.device("cpu"),
                                          **({"layer_type": layer_type} if per_type else {}))


class RotaryEmbedding(nn.Module):
    """Precomputed cos/sin tables ``[max_positions, rotary_dim]`` by absolute position
    (rotate-half convention; ``rotary_dim`` < head_dim where rotary is partial); the model's
    ops apply them (see ``elementwise``)."""

    def __init__(self, hf_config, max_positions: int, dtype: torch.dtype,
                 layer_type: str | None = None) -> None:
        super().__init__()
        inv_freq, scaling = rope_inverse_frequencies(hf_config, layer_type)
        freqs = torch.arange(max_positions, dtype=torch.float)[:, None] * inv_freq[None, :]
        emb = torch.cat((freqs, freqs), dim=-1)
        self.register_buffer("cos", (emb.cos() * scaling).to(dtype), persistent=False)
        self.register_buffer("sin", (emb.sin() * scaling).to(dtype), persistent=False)

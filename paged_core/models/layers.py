"""Building blocks shared by the model files: RMSNorm (Llama's and Gemma's) and rotary
embeddings."""
from __future__ import annotations

import torch
from torch import nn

from .elementwise import TORCH_OPS
from .spec import long_rope_switch


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
    ops apply them (see ``elementwise``), a row per token: its position.

    LongRoPE doubles the tables: rows ``[0, max_positions)`` hold the short factors, rows
    ``[max_positions, 2 * max_positions)`` the long ones, so a token rotated with the long
    factors reads row ``max_positions + position`` (``executor.packed_batch.rope_rows``)."""

    def __init__(self, hf_config, max_positions: int, dtype: torch.dtype,
                 layer_type: str | None = None) -> None:
        super().__init__()
        tables = [_cos_sin(*rope_inverse_frequencies(hf_config, layer_type), max_positions)]
        switch = long_rope_switch(hf_config) if layer_type is None else None
        if switch is not None:
            tables.append(_cos_sin(*_long_rope_frequencies(hf_config, switch), max_positions))
        cos, sin = (torch.cat(t) for t in zip(*tables))
        self.register_buffer("cos", cos.to(dtype), persistent=False)
        self.register_buffer("sin", sin.to(dtype), persistent=False)


def _cos_sin(inv_freq: torch.Tensor, scaling: float,
             max_positions: int) -> tuple[torch.Tensor, torch.Tensor]:
    freqs = torch.arange(max_positions, dtype=torch.float)[:, None] * inv_freq[None, :]
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos() * scaling, emb.sin() * scaling


def _long_rope_frequencies(hf_config, switch: int) -> tuple[torch.Tensor, float]:
    """LongRoPE's long factors, as transformers computes them for a sequence past ``switch``."""
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS
    return ROPE_INIT_FUNCTIONS["longrope"](hf_config, torch.device("cpu"), seq_len=switch + 1)

"""Building blocks shared by the model files: RMSNorm and rotary embeddings."""
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


def rope_inverse_frequencies(hf_config) -> tuple[torch.Tensor, float]:
    """Inverse frequencies and attention scaling from ``config.rope_parameters``.

    Non-default RoPE types (llama3, linear, yarn, ...) reuse transformers' own
    initialisation functions so their maths stays identical to the reference.
    """
    params = getattr(hf_config, "rope_parameters", None) or {}
    rope_type = params.get("rope_type", "default")
    if rope_type == "default":
        head_dim = getattr(hf_config, "head_dim", None) or (
            hf_config.hidden_size // hf_config.num_attention_heads)
        base = params["rope_theta"]
        inv_freq = 1.0 / (base ** (torch.arange(0, head_dim, 2, dtype=torch.float) / head_dim))
        return inv_freq, 1.0
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS
    if rope_type not in ROPE_INIT_FUNCTIONS:
        raise ValueError(f"unsupported rope_type {rope_type!r}")
    return ROPE_INIT_FUNCTIONS[rope_type](hf_config, torch.device("cpu"))


class RotaryEmbedding(nn.Module):
    """Precomputed cos/sin tables ``[max_positions, head_dim]`` by absolute position
    (rotate-half convention); the model's ops apply them (see ``elementwise``)."""

    def __init__(self, hf_config, max_positions: int, dtype: torch.dtype) -> None:
        super().__init__()
        inv_freq, scaling = rope_inverse_frequencies(hf_config)
        freqs = torch.arange(max_positions, dtype=torch.float)[:, None] * inv_freq[None, :]
        emb = torch.cat((freqs, freqs), dim=-1)
        self.register_buffer("cos", (emb.cos() * scaling).to(dtype), persistent=False)
        self.register_buffer("sin", (emb.sin() * scaling).to(dtype), persistent=False)

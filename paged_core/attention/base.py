"""The seam between model code and attention implementations.

A backend writes a layer's new K/V into the paged cache and computes attention
of the step's queries over each sequence's cached context (causal within the
new tokens). Each backend chooses its per-layer cache layout (``kv_cache_shape``);
the Triton kernels use ``[num_blocks, block_size, num_kv_heads, head_dim]``. A cache's
dtype is the model's, or a quantized one (``kv_cache_dtype``, ``kv_quant``) whose rows are
``head_dim + 4`` one-byte elements (codes, then their float32 scale): every backend quantizes
in ``write_kv`` and dequantizes in ``attend``; ``copy_blocks`` moves whole rows.
"""
from __future__ import annotations

from typing import Protocol

import torch

from .metadata import AttentionMetadata


class AttentionBackend(Protocol):
    name: str

    @staticmethod
    def kv_cache_shape(num_blocks: int, block_size: int, num_kv_heads: int,
                       head_dim: int) -> tuple[int, ...]:
        """Shape of one layer's K (or V) cache tensor; ``head_dim`` is the row length
        (``kv_quant.kv_cache_row``: ``head_dim + 4`` for a quantized cache)."""

    def write_kv(self, key: torch.Tensor, value: torch.Tensor, k_cache: torch.Tensor,
                 v_cache: torch.Tensor, meta: AttentionMetadata) -> None:
        """Store ``key``/``value`` ``[num_tokens, num_kv_heads, head_dim]`` at ``meta.slot_mapping``."""

    def attend(self, query: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
               meta: AttentionMetadata, scale: float, sliding_window: int | None = None,
               logits_soft_cap: float | None = None) -> torch.Tensor:
        """Return ``[num_tokens, num_heads, head_dim]`` for ``query`` of the same shape: softmax
        of the scaled scores ``s`` (``logits_soft_cap * tanh(s / logits_soft_cap)`` where
        given) over the keys each query sees (causal, ``sliding_window``)."""

    def copy_blocks(self, k_caches: list[torch.Tensor], v_caches: list[torch.Tensor],
                    src: torch.Tensor, dst: torch.Tensor) -> None:
        """Copy physical blocks ``src[i]`` to ``dst[i]`` in every layer (copy-on-write)."""

"""``TritonAttentionBackend``: the :class:`AttentionBackend` over ``paged_core.kernels``.

A thin adapter: it forwards :class:`AttentionMetadata` fields to the kernels
and passes the metadata's host-side ``max_seq_len``/``max_query_len`` as
tuning hints, so no call syncs with the device. Runs on CUDA (or on CPU under
``TRITON_INTERPRET=1``, for tests).
"""
from __future__ import annotations

import torch

from paged_core.kernels import copy_blocks, paged_attention, write_kv_cache

from .metadata import AttentionMetadata


class TritonAttentionBackend:
    name = "triton"

    @staticmethod
    def kv_cache_shape(num_blocks: int, block_size: int, num_kv_heads: int,
                       head_dim: int) -> tuple[int, ...]:
        return (num_blocks, block_size, num_kv_heads, head_dim)

    def write_kv(self, key: torch.Tensor, value: torch.Tensor, k_cache: torch.Tensor,
                 v_cache: torch.Tensor, meta: AttentionMetadata) -> None:
        """Store ``key``/``value`` ``[num_tokens, num_kv_heads, head_dim]`` at their slots."""
        write_kv_cache(key, value, k_cache, v_cache, meta.slot_mapping)

    def attend(self, query: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
               meta: AttentionMetadata, scale: float,
               sliding_window: int | None = None,
               logits_soft_cap: float | None = None) -> torch.Tensor:
        """Return ``[num_tokens, num_heads, head_dim]`` for ``query`` of the same shape."""
        return paged_attention(
            query, k_cache, v_cache, meta.block_tables, meta.seq_lens, meta.query_start_loc,
            scale, sliding_window, max_seq_len=meta.max_seq_len,
            max_query_len=meta.max_query_len, logits_soft_cap=logits_soft_cap)

    def copy_blocks(self, k_caches: list[torch.Tensor], v_caches: list[torch.Tensor],
                    src: torch.Tensor, dst: torch.Tensor) -> None:
        """Copy physical blocks ``src[i]`` to ``dst[i]`` in every layer (copy-on-write)."""
        if src.numel() == 0:
            return
        device = k_caches[0].device
        src, dst = src.to(device), dst.to(device)
        for k_cache, v_cache in zip(k_caches, v_caches, strict=True):
            copy_blocks(k_cache, v_cache, src, dst)

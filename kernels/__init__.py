"""Triton kernels for a paged KV cache: ``paged_core.kernels``.

A small public API that any engine can call; of the rest of ``paged_core`` it uses
only the quantized KV cache format, ``paged_core.attention.kv_quant`` (plain torch).

Layouts (one transformer layer)
-------------------------------
- ``k_cache``, ``v_cache``: ``[num_blocks, block_size, num_kv_heads, head_dim]``.
  The inner three dims of each must be contiguous; the block stride is free
  (so K and V may live interleaved in one allocation). ``block_size`` is a
  power of two (8 to 128).
- slot ``s`` is physical block ``s // block_size``, offset ``s % block_size``.
- a step's tokens are packed back to back: ``q``/``out`` are
  ``[num_tokens, num_heads, head_dim]`` and sequence ``i`` owns rows
  ``query_start_loc[i]:query_start_loc[i+1]`` (``int32``, ``num_seqs + 1`` prefix sums).
- ``seq_lens[i]`` (``int32``) is sequence ``i``'s total context *after* the step
  (cached + new tokens), so its new tokens sit at positions
  ``seq_lens[i] - query_len_i .. seq_lens[i] - 1``. Each new token attends to
  the cached prefix and causally to the new tokens before it (prefill, chunked
  prefill, prefix-cache hits and decode are all the same call).
- ``block_tables[i, j]`` (``int32``) is the physical block of sequence ``i``'s
  ``j``-th logical block; entries past the sequence's last block are never read.
- ``num_heads`` is a multiple of ``num_kv_heads`` (MHA, GQA, MQA); query head
  ``h`` reads KV head ``h // (num_heads // num_kv_heads)``.
- sliding window ``w`` (Mistral / Hugging Face semantics): a query at position
  ``p`` attends keys at positions ``k`` with ``p - w < k <= p``.

Dtypes: float16, bfloat16, float32 (all accumulate in float32; float32 uses
IEEE dot products). The cache may instead be quantized (``torch.int8``,
``torch.float8_e4m3fn``, ``torch.float8_e5m2``; ``paged_core.attention.kv_quant``):
its last dim is ``head_dim + 4``, each row's codes followed by the bytes of its float32
scale (``head_dim % 4 == 0``); ``write_kv_cache`` quantizes, ``paged_attention`` decodes
with queries of any of the three float dtypes, ``copy_blocks`` moves the scales too.
All index arithmetic that scales with the cache size is done in int64. Kernels run on
CUDA, or on CPU under ``TRITON_INTERPRET=1`` (set before ``paged_core.kernels`` is first
imported).

Functions
---------
- :func:`write_kv_cache` stores a step's new K/V at their slots (``-1`` skips).
- :func:`paged_attention` computes attention of a packed step over the cache,
  with an automatic split-KV (flash-decoding) path for long contexts.
- :func:`copy_blocks` copies whole blocks (copy-on-write).
- :mod:`paged_core.kernels.reference` holds plain-torch versions of all three.
"""
from ._top_level_name import hand_over_to_installed_kernels

# Imported as the top-level `kernels` where Hugging Face's is installed, sys.modules["kernels"]
# is now that package and this one defines nothing.
if not hand_over_to_installed_kernels(__name__):
    from .cache_ops import copy_blocks, write_kv_cache
    from .attention import choose_num_splits, paged_attention

    __all__ = ["copy_blocks", "write_kv_cache", "paged_attention", "choose_num_splits"]

"""Cache maintenance kernels: store a step's K/V, and copy whole blocks.

Invariants:
- caches follow the layout in :mod:`paged_core.kernels` (contiguous inside a block);
- a slot is ``block * block_size + offset``; negative slots are skipped, so
  padded batches need no host-side filtering;
- every address that scales with the cache size is computed in int64.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from paged_core.attention.kv_quant import as_bytes, is_quantized, quantize

from ._checks import check_cache, check_device, next_pow2


@triton.jit
def _write_kv_kernel(key_ptr, value_ptr, k_cache_ptr, v_cache_ptr, slot_ptr,
                     stride_kt, stride_kh, stride_kd, stride_vt, stride_vh, stride_vd,
                     stride_kb, stride_vb, NUM_KV_HEADS: tl.constexpr, HEAD_DIM: tl.constexpr,
                     BLOCK_SIZE: tl.constexpr, HEADS_PAD: tl.constexpr, DIM_PAD: tl.constexpr):
    """One program per token: copy its ``[num_kv_heads, head_dim]`` K and V into its slot."""
    token = tl.program_id(0).to(tl.int64)
    slot = tl.load(slot_ptr + token).to(tl.int64)
    if slot < 0:
        return
    block = slot // BLOCK_SIZE
    offset = slot % BLOCK_SIZE
    heads = tl.arange(0, HEADS_PAD)[:, None]
    dims = tl.arange(0, DIM_PAD)[None, :]
    mask = (heads < NUM_KV_HEADS) & (dims < HEAD_DIM)
    k = tl.load(key_ptr + token * stride_kt + heads * stride_kh + dims * stride_kd, mask=mask)
    v = tl.load(value_ptr + token * stride_vt + heads * stride_vh + dims * stride_vd, mask=mask)
    inner = offset * (NUM_KV_HEADS * HEAD_DIM) + heads * HEAD_DIM + dims
    tl.store(k_cache_ptr + block * stride_kb + inner, k, mask=mask)
    tl.store(v_cache_ptr + block * stride_vb + inner, v, mask=mask)


def write_kv_cache(key: torch.Tensor, value: torch.Tensor, k_cache: torch.Tensor,
                   v_cache: torch.Tensor, slot_mapping: torch.Tensor) -> None:
    """Store ``key``/``value`` ``[num_tokens, num_kv_heads, head_dim]`` at ``slot_mapping``.

    ``slot_mapping`` is ``[num_tokens]`` int32/int64; ``-1`` (any negative) skips
    the token. Slots must be distinct among non-skipped tokens. ``key``/``value``
    may be strided views (e.g. slices of a fused QKV projection); they are cast
    to the cache dtype on store, or, for a quantized cache, quantized into rows that end in
    their scale (``kv_quant.quantize``), which the kernel then stores as bytes.
    """
    _, block_size, kv_heads, dim = check_cache(k_cache, v_cache)
    check_device(key, value, k_cache, v_cache, slot_mapping)
    num_tokens = key.shape[0]
    expected = (num_tokens, kv_heads, dim)
    if tuple(key.shape) != expected or tuple(value.shape) != expected:
        raise ValueError(f"key/value must be {list(expected)}, "
                         f"got {list(key.shape)} and {list(value.shape)}")
    if tuple(slot_mapping.shape) != (num_tokens,):
        raise ValueError(f"slot_mapping must be [{num_tokens}], got {list(slot_mapping.shape)}")
    if num_tokens == 0:
        return
    if is_quantized(k_cache):
        key, value = (as_bytes(quantize(x, k_cache.dtype)) for x in (key, value))
        k_cache, v_cache, dim = as_bytes(k_cache), as_bytes(v_cache), key.shape[-1]
    _write_kv_kernel[(num_tokens,)](
        key, value, k_cache, v_cache, slot_mapping,
        *key.stride(), *value.stride(), k_cache.stride(0), v_cache.stride(0),
        NUM_KV_HEADS=kv_heads, HEAD_DIM=dim, BLOCK_SIZE=block_size,
        HEADS_PAD=next_pow2(kv_heads), DIM_PAD=next_pow2(dim))


@triton.jit
def _copy_blocks_kernel(k_cache_ptr, v_cache_ptr, src_ptr, dst_ptr, stride_kb, stride_vb,
                        block_numel, CHUNK: tl.constexpr):
    """Program ``(pair, chunk)`` copies ``CHUNK`` elements of ``src[pair]`` to ``dst[pair]``."""
    pair = tl.program_id(0)
    offs = tl.program_id(1).to(tl.int64) * CHUNK + tl.arange(0, CHUNK)
    mask = offs < block_numel
    src = tl.load(src_ptr + pair).to(tl.int64)
    dst = tl.load(dst_ptr + pair).to(tl.int64)
    k = tl.load(k_cache_ptr + src * stride_kb + offs, mask=mask)
    tl.store(k_cache_ptr + dst * stride_kb + offs, k, mask=mask)
    v = tl.load(v_cache_ptr + src * stride_vb + offs, mask=mask)
    tl.store(v_cache_ptr + dst * stride_vb + offs, v, mask=mask)


def copy_blocks(k_cache: torch.Tensor, v_cache: torch.Tensor, src: torch.Tensor,
                dst: torch.Tensor) -> None:
    """Copy physical block ``src[i]`` to ``dst[i]`` in both caches (copy-on-write); a
    quantized cache's scales, in its rows, move with them.

    ``src``/``dst`` are 1-D integer tensors of equal length on the cache's device.
    No ``dst`` block may appear in ``src`` or twice in ``dst`` (pairs run in
    parallel, in no particular order).
    """
    _, block_size, kv_heads, dim = check_cache(k_cache, v_cache)
    check_device(k_cache, v_cache, src, dst)
    if src.dim() != 1 or src.shape != dst.shape:
        raise ValueError(f"src/dst must be 1-D and equal length, got {list(src.shape)} "
                         f"and {list(dst.shape)}")
    if src.numel() == 0:
        return
    k_cache, v_cache = as_bytes(k_cache), as_bytes(v_cache)
    block_numel = block_size * kv_heads * k_cache.shape[-1]
    chunk = min(next_pow2(block_numel), 4096)
    grid = (src.numel(), triton.cdiv(block_numel, chunk))
    _copy_blocks_kernel[grid](k_cache, v_cache, src, dst, k_cache.stride(0), v_cache.stride(0),
                              block_numel, CHUNK=chunk)

"""Argument checks shared by the kernel launchers.

They run on the host, read only shapes/strides/dtypes (never tensor values, so
no device sync), and raise ``ValueError`` naming the offending argument.
"""
from __future__ import annotations

import torch
import triton

from paged_core.attention.kv_quant import QUANTIZED_DTYPES, SCALE_BYTES, kv_cache_row

SUPPORTED_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
CACHE_DTYPES = SUPPORTED_DTYPES + QUANTIZED_DTYPES  # quantized: rows end in their scale

# ``@triton.jit`` picks compiled or interpreted kernels when a module is imported
# (from ``TRITON_INTERPRET``); this package's kernel modules import this one
# first, so the value captured here is the mode of every kernel in the package.
_INTERPRETED = bool(triton.knobs.runtime.interpret)


def interpreting() -> bool:
    """True when this package's kernels run in Triton's CPU interpreter."""
    return _INTERPRETED


def check_device(*tensors: torch.Tensor) -> None:
    """All tensors on one device, and that device is CUDA unless interpreting."""
    device = tensors[0].device
    for t in tensors:
        if t.device != device:
            raise ValueError(f"all tensors must be on {device}, found one on {t.device}")
    if device.type != "cuda" and not interpreting():
        raise ValueError(
            f"Triton kernels need CUDA tensors, got {device}; for CPU set TRITON_INTERPRET=1 "
            f"before paged_core.kernels is first imported (slow, for tests only)")


def check_cache(k_cache: torch.Tensor, v_cache: torch.Tensor) -> tuple[int, int, int, int]:
    """Validate the paged cache layout and return ``(num_blocks, block_size, kv_heads, dim)``.

    Invariant checked: K and V have one shape and dtype, a supported dtype, a
    power-of-two block size, and contiguous ``[block_size, kv_heads, row]``
    inner dims (the block stride may be anything >= one block). ``row`` is ``head_dim``,
    or ``head_dim + 4`` for a quantized cache (``paged_core.attention.kv_quant``), whose
    ``head_dim`` is returned.
    """
    if k_cache.dim() != 4 or k_cache.shape != v_cache.shape:
        raise ValueError(
            f"k_cache/v_cache must both be [num_blocks, block_size, num_kv_heads, head_dim], "
            f"got {tuple(k_cache.shape)} and {tuple(v_cache.shape)}")
    if k_cache.dtype != v_cache.dtype or k_cache.dtype not in CACHE_DTYPES:
        raise ValueError(f"cache dtype must be one of {CACHE_DTYPES} (same for K and V), "
                         f"got {k_cache.dtype} and {v_cache.dtype}")
    num_blocks, block_size, kv_heads, dim = k_cache.shape
    if block_size & (block_size - 1):
        raise ValueError(f"block_size must be a power of two, got {block_size}")
    inner = (kv_heads * dim, dim, 1)
    for name, cache in (("k_cache", k_cache), ("v_cache", v_cache)):
        if tuple(cache.stride()[1:]) != inner:
            raise ValueError(f"{name} must be contiguous within a block; strides {cache.stride()}")
    if k_cache.dtype in QUANTIZED_DTYPES:
        dim -= SCALE_BYTES
        kv_cache_row(dim, k_cache.dtype)  # raises unless head_dim % 4 == 0
    return num_blocks, block_size, kv_heads, dim


def next_pow2(n: int, minimum: int = 1) -> int:
    """Smallest power of two >= max(n, minimum)."""
    return max(minimum, 1 << (max(n, 1) - 1).bit_length())

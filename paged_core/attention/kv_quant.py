"""The quantized KV cache format (``kv_cache_dtype`` ``int8`` / ``fp8_e4m3`` / ``fp8_e5m2``).

Every backend keeps its own layout with ``head_dim`` last; a quantized cache keeps that
layout but each ``[head_dim]`` row (one token slot of one KV head) becomes ``head_dim + 4``
one-byte elements: ``head_dim`` quantized values, then the 4 bytes of that row's float32
scale (like llama.cpp's ``q8_0`` blocks carry their own scale). So:

- the cache tensor's dtype names the format (``torch.int8``, ``torch.float8_e4m3fn``,
  ``torch.float8_e5m2``; anything else is a plain float cache, ``is_quantized`` False);
- a row dequantizes to ``value * scale``; symmetric, ``scale = absmax(row) / max_code``
  (127 for int8, the format's largest finite value for fp8), 0 for an all-zero row;
- a scale moves with its values: block copies (copy-on-write forks), gathers and slot
  writes of whole rows need no second tensor, so prefix caching, preemption and forks
  work as for a float cache;
- ``head_dim % 4 == 0`` keeps every scale 4-byte aligned (``kv_cache_row``).

Quantizing rounds to nearest (int8: ``|error| <= scale / 2``; fp8: the format's relative
step, 2^-4 for e4m3, 2^-3 for e5m2, over the row's absmax).
"""
from __future__ import annotations

import torch

KV_CACHE_DTYPES = ("auto", "int8", "fp8", "fp8_e4m3", "fp8_e5m2")
_QUANTIZED = {"int8": torch.int8, "fp8": torch.float8_e4m3fn,
              "fp8_e4m3": torch.float8_e4m3fn, "fp8_e5m2": torch.float8_e5m2}
QUANTIZED_DTYPES = (torch.int8, torch.float8_e4m3fn, torch.float8_e5m2)
SCALE_BYTES = 4  # one float32 per row


def cache_dtype(kv_cache_dtype: str, model_dtype: torch.dtype) -> torch.dtype:
    """The cache tensors' dtype: ``model_dtype`` for ``"auto"``, else the quantized one."""
    return model_dtype if kv_cache_dtype == "auto" else _QUANTIZED[kv_cache_dtype]


def is_quantized(cache: torch.Tensor) -> bool:
    return cache.dtype in QUANTIZED_DTYPES


def max_code(dtype: torch.dtype) -> float:
    """The largest value a quantized element holds (the scale maps the row's absmax to it)."""
    return 127.0 if dtype == torch.int8 else float(torch.finfo(dtype).max)


def kv_cache_row(head_dim: int, dtype: torch.dtype) -> int:
    """Elements of one cache row (the cache shape's last dim) for ``head_dim`` in ``dtype``."""
    if dtype not in QUANTIZED_DTYPES:
        return head_dim
    if head_dim % 4:
        raise ValueError(f"kv_cache_dtype {str(dtype).removeprefix('torch.')} needs head_dim "
                         f"divisible by 4 (its rows end in a float32 scale), got {head_dim}")
    return head_dim + SCALE_BYTES


def kv_cache_row_bytes(head_dim: int, dtype: torch.dtype) -> int:
    """Bytes of one cache row: values plus, for a quantized cache, its scale."""
    return kv_cache_row(head_dim, dtype) * torch.empty((), dtype=dtype).element_size()


def quantize(x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Rows ``x`` ``[..., head_dim]`` (any float dtype) as cache rows ``[..., head_dim + 4]``
    of quantized ``dtype`` (see the module doc)."""
    x = x.float()
    amax = x.abs().amax(dim=-1, keepdim=True)
    # Divide by a tensor, not a Python number: CUDA's division by a host scalar multiplies by
    # its reciprocal (1 ulp off at times), so the scales' bits would depend on the device.
    scale = amax / torch.full_like(amax, max_code(dtype))
    codes = x / torch.where(scale > 0, scale, 1.0)
    if dtype == torch.int8:
        codes = codes.round_().clamp_(-127, 127)
    else:
        codes = codes.clamp_(-max_code(dtype), max_code(dtype))
    rows = torch.empty((*x.shape[:-1], x.shape[-1] + SCALE_BYTES), dtype=torch.uint8,
                       device=x.device)
    rows[..., :-SCALE_BYTES] = codes.to(dtype).view(torch.uint8)
    rows[..., -SCALE_BYTES:] = scale.view(torch.uint8)
    return rows.view(dtype)


def dequantize(rows: torch.Tensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Cache rows ``[..., head_dim + 4]`` back to values ``[..., head_dim]`` in ``dtype``
    (computed in float32, then cast)."""
    scale = rows[..., -SCALE_BYTES:].view(torch.float32)  # [..., 1]
    return (rows[..., :-SCALE_BYTES].float() * scale).to(dtype)


def as_bytes(cache: torch.Tensor) -> torch.Tensor:
    """A quantized cache as ``uint8`` (the same memory), where moving rows needs no casts."""
    return cache.view(torch.uint8) if is_quantized(cache) else cache


def written_codes(dtype: torch.dtype) -> torch.Tensor:
    """Every code ``quantize`` can write in ``dtype``, as float32 values: all 256 but int8's
    -128 (levels are clamped to ±127) and fp8's NaN / infinities."""
    bits = torch.arange(256, dtype=torch.uint8)
    written = bits.view(torch.int8) != -128 if dtype == torch.int8 else \
        bits.view(dtype).float().isfinite()
    return bits[written].view(dtype).float()

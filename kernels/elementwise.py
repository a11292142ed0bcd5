"""Fused elementwise steps of a decoder layer as Triton kernels: one launch each instead of the
5-10 small kernels plain torch launches (on a GPU, a batch-1 decode step is mostly launches).

They compute what ``paged_core.models.elementwise.TorchOps`` computes, rounding to the
tensors' dtype where torch rounds (float32 inside), so they agree with it to the last bit of
float32 ``rsqrt``/``exp`` and of fused multiply-adds:

- ``rms_norm(x, weight, eps, residual=None)``: ``weight * dtype(x * rsqrt(mean(x^2) + eps))``
  over the last dim; with ``residual`` it first stores ``residual + x`` (rounded to the
  dtype) into ``residual`` and normalises that;
- ``rotate_(q, k, positions, cos, sin)``: rotary embedding in place, rotate-half
  convention, over the tables' width (``cos``/``sin`` ``[rows, rotary_dim]``; the first
  ``rotary_dim`` dims of each head rotate, the rest pass through), token ``t`` reading
  table row ``positions[t]``;
- ``silu_and_mul(gate_up)``: ``dtype(silu(gate)) * up`` for ``gate_up = [gate | up]``.

Inputs are CUDA tensors (or CPU tensors under ``TRITON_INTERPRET=1``) whose last dim is
contiguous; rows may be strided (``q``/``k`` are views into a fused QKV projection).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from ._checks import next_pow2


@triton.jit
def _rms_norm_kernel(x_ptr, residual_ptr, weight_ptr, out_ptr, num_cols, eps,
                     stride_x, stride_r, stride_o, HAS_RESIDUAL: tl.constexpr,
                     BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    mask = cols < num_cols
    x = tl.load(x_ptr + row * stride_x + cols, mask=mask, other=0.0)
    if HAS_RESIDUAL:
        r = tl.load(residual_ptr + row * stride_r + cols, mask=mask, other=0.0)
        x = (r.to(tl.float32) + x.to(tl.float32)).to(r.dtype)
        tl.store(residual_ptr + row * stride_r + cols, x, mask=mask)
    x32 = x.to(tl.float32)
    mean_square = tl.sum(x32 * x32, axis=0) / num_cols
    normed = (x32 * tl.math.rsqrt(mean_square + eps)).to(x.dtype)
    weight = tl.load(weight_ptr + cols, mask=mask, other=0.0)
    out = (weight.to(tl.float32) * normed.to(tl.float32)).to(out_ptr.dtype.element_ty)
    tl.store(out_ptr + row * stride_o + cols, out, mask=mask)


def _rows(x: torch.Tensor) -> torch.Tensor:
    """``x`` as a 2-D ``[rows, last dim]`` view (a copy only if it cannot be viewed so)."""
    if x.stride(-1) != 1:
        x = x.contiguous()
    try:
        return x.view(-1, x.shape[-1])
    except RuntimeError:
        return x.reshape(-1, x.shape[-1])


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float,
             residual: torch.Tensor | None = None) -> torch.Tensor:
    """See the module docstring; ``residual`` (same shape as ``x``, contiguous) is updated in
    place. Returns a new tensor shaped like ``x``."""
    rows = _rows(x)
    out = torch.empty(rows.shape, dtype=x.dtype, device=x.device)
    if rows.shape[0] == 0:
        return out.view(x.shape)
    res = rows if residual is None else residual.view(-1, x.shape[-1])
    _rms_norm_kernel[(rows.shape[0],)](
        rows, res, weight, out, rows.shape[1], eps, rows.stride(0), res.stride(0),
        out.stride(0), HAS_RESIDUAL=residual is not None, BLOCK=next_pow2(rows.shape[1]))
    return out.view(x.shape)


@triton.jit
def _rotate_heads(x_ptr, stride_t, stride_h, token, cos_lo, cos_hi, sin_lo, sin_hi,
                  NUM_HEADS: tl.constexpr, HEADS_PAD: tl.constexpr, HALF: tl.constexpr,
                  HALF_PAD: tl.constexpr):
    heads = tl.arange(0, HEADS_PAD)[:, None]
    dims = tl.arange(0, HALF_PAD)[None, :]
    mask = (heads < NUM_HEADS) & (dims < HALF)
    lo_ptr = x_ptr + token * stride_t + heads * stride_h + dims
    lo = tl.load(lo_ptr, mask=mask, other=0.0)
    hi = tl.load(lo_ptr + HALF, mask=mask, other=0.0)
    dtype = lo.dtype
    lo32, hi32 = lo.to(tl.float32), hi.to(tl.float32)
    # torch: x * cos + rotate_half(x) * sin, each product and the sum rounded to the dtype
    new_lo = ((lo32 * cos_lo).to(dtype).to(tl.float32)
              + (-hi32 * sin_lo).to(dtype).to(tl.float32)).to(dtype)
    new_hi = ((hi32 * cos_hi).to(dtype).to(tl.float32)
              + (lo32 * sin_hi).to(dtype).to(tl.float32)).to(dtype)
    tl.store(lo_ptr, new_lo, mask=mask)
    tl.store(lo_ptr + HALF, new_hi, mask=mask)


@triton.jit
def _rotary_kernel(q_ptr, k_ptr, pos_ptr, cos_ptr, sin_ptr, stride_qt, stride_qh, stride_kt,
                   stride_kh, stride_table, NUM_Q_HEADS: tl.constexpr, Q_PAD: tl.constexpr,
                   NUM_K_HEADS: tl.constexpr, K_PAD: tl.constexpr, HALF: tl.constexpr,
                   HALF_PAD: tl.constexpr):
    """One program per token: every q and k head of it."""
    token = tl.program_id(0).to(tl.int64)
    row = tl.load(pos_ptr + token).to(tl.int64) * stride_table
    dims = tl.arange(0, HALF_PAD)[None, :]
    in_half = dims < HALF
    cos_lo = tl.load(cos_ptr + row + dims, mask=in_half, other=0.0).to(tl.float32)
    cos_hi = tl.load(cos_ptr + row + HALF + dims, mask=in_half, other=0.0).to(tl.float32)
    sin_lo = tl.load(sin_ptr + row + dims, mask=in_half, other=0.0).to(tl.float32)
    sin_hi = tl.load(sin_ptr + row + HALF + dims, mask=in_half, other=0.0).to(tl.float32)
    _rotate_heads(q_ptr, stride_qt, stride_qh, token, cos_lo, cos_hi, sin_lo, sin_hi,
                  NUM_Q_HEADS, Q_PAD, HALF, HALF_PAD)
    _rotate_heads(k_ptr, stride_kt, stride_kh, token, cos_lo, cos_hi, sin_lo, sin_hi,
                  NUM_K_HEADS, K_PAD, HALF, HALF_PAD)


def rotate_(q: torch.Tensor, k: torch.Tensor, positions: torch.Tensor, cos: torch.Tensor,
            sin: torch.Tensor) -> None:
    """Rotate ``q`` ``[T, Hq, D]`` and ``k`` ``[T, Hk, D]`` in place (see the module docstring);
    their last dim must be contiguous, ``cos``/``sin`` contiguous ``[rows, rotary_dim]``."""
    if q.stride(-1) != 1 or k.stride(-1) != 1:
        raise ValueError("rotate_ needs q and k with a contiguous last dim")
    num_tokens, rotary_dim = q.shape[0], cos.shape[-1]
    if num_tokens == 0:
        return
    half = rotary_dim // 2
    _rotary_kernel[(num_tokens,)](
        q, k, positions, cos, sin, q.stride(0), q.stride(1), k.stride(0), k.stride(1),
        cos.stride(0), NUM_Q_HEADS=q.shape[1], Q_PAD=next_pow2(q.shape[1]),
        NUM_K_HEADS=k.shape[1], K_PAD=next_pow2(k.shape[1]), HALF=half,
        HALF_PAD=next_pow2(half))


@triton.jit
def _silu_and_mul_kernel(gate_up_ptr, out_ptr, width, stride_in, stride_out,
                         BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < width
    gate = tl.load(gate_up_ptr + row * stride_in + cols, mask=mask, other=0.0)
    up = tl.load(gate_up_ptr + row * stride_in + width + cols, mask=mask, other=0.0)
    g32 = gate.to(tl.float32)
    silu = (g32 / (1.0 + tl.exp(-g32))).to(gate.dtype)
    out = (silu.to(tl.float32) * up.to(tl.float32)).to(gate.dtype)
    tl.store(out_ptr + row * stride_out + cols, out, mask=mask)


def silu_and_mul(gate_up: torch.Tensor) -> torch.Tensor:
    """``[T, 2 * I]`` -> ``[T, I]`` (see the module docstring)."""
    rows = _rows(gate_up)
    width = rows.shape[1] // 2
    out = torch.empty(rows.shape[0], width, dtype=gate_up.dtype, device=gate_up.device)
    if rows.shape[0] == 0:
        return out
    block = min(1024, next_pow2(width))
    _silu_and_mul_kernel[(rows.shape[0], triton.cdiv(width, block))](
        rows, out, width, rows.stride(0), out.stride(0), BLOCK=block)
    return out

"""LoRA products of a step whose rows run different adapters, as Triton kernels (Punica's
BGMV: one program per row and block of outputs, each reading its own row's adapter):

- ``lora_shrink(x, a, widths, token_slots)``: ``u[t, :w] = a[s, :w] @ x[t]`` (float32
  ``[T, W]``, zero past ``w`` and for rows without an adapter);
- ``lora_expand_(y, u, b_t, widths, token_slots)``: ``y[t] = dtype(y[t] + u[t, :w] @ b_t[s, :w])``
  in place,

with ``s = token_slots[t]`` (-1: no adapter; the row is left alone), ``w = widths[s]`` (0:
the slot holds nothing). ``a`` is ``[S, W, in]`` and ``b_t`` ``[S, W, out]``, contiguous,
float32 or the model's dtype; sums run in float32. They compute what the CPU ops of
``paged_core/cpu/csrc/lora_products.cpp`` compute (``paged_core.lora.products``). Only the
first ``T = len(token_slots)`` rows of ``x`` and ``y`` are read or written.

Inputs are CUDA tensors (or CPU tensors under ``TRITON_INTERPRET=1``) whose last dim is
contiguous; ``token_slots`` and ``widths`` are int64 tensors on the same device (no host
read of their values, so a step launches without a device sync).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from ._checks import SUPPORTED_DTYPES, check_device

_SHRINK_BLOCK_K = 16
_SHRINK_BLOCK_IN = 128
_EXPAND_BLOCK_OUT = 128
_EXPAND_BLOCK_K = 16


@triton.jit
def _row_width(slots_ptr, widths_ptr, row):
    slot = tl.load(slots_ptr + row)
    width = tl.load(widths_ptr + tl.maximum(slot, 0))
    return tl.maximum(slot, 0), tl.where(slot >= 0, width, 0)


@triton.jit
def _shrink_kernel(x_ptr, a_ptr, widths_ptr, slots_ptr, u_ptr, in_features, W, stride_x,
                   BLOCK_K: tl.constexpr, BLOCK_IN: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    ks = tl.program_id(1) * BLOCK_K + tl.arange(0, BLOCK_K)
    slot, width = _row_width(slots_ptr, widths_ptr, row)
    acc = tl.zeros([BLOCK_K], dtype=tl.float32)
    for start in range(0, in_features, BLOCK_IN):
        cols = start + tl.arange(0, BLOCK_IN)
        x = tl.load(x_ptr + row * stride_x + cols, mask=cols < in_features, other=0.0)
        a = tl.load(a_ptr + (slot * W + ks[:, None]) * in_features + cols[None, :],
                    mask=(ks[:, None] < width) & (cols[None, :] < in_features), other=0.0)
        acc += tl.sum(a.to(tl.float32) * x.to(tl.float32)[None, :], axis=1)
    tl.store(u_ptr + row * W + ks, acc, mask=ks < W)


@triton.jit
def _expand_kernel(y_ptr, u_ptr, b_ptr, widths_ptr, slots_ptr, out_features, W, stride_y,
                   BLOCK_OUT: tl.constexpr, BLOCK_K: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK_OUT + tl.arange(0, BLOCK_OUT)
    slot, width = _row_width(slots_ptr, widths_ptr, row)
    acc = tl.zeros([BLOCK_OUT], dtype=tl.float32)
    for start in range(0, W, BLOCK_K):
        ks = start + tl.arange(0, BLOCK_K)
        u = tl.load(u_ptr + row * W + ks, mask=ks < width, other=0.0)
        b = tl.load(b_ptr + (slot * W + ks[:, None]) * out_features + cols[None, :],
                    mask=(ks[:, None] < width) & (cols[None, :] < out_features), other=0.0)
        acc += tl.sum(u[:, None] * b.to(tl.float32), axis=0)
    mask = cols < tl.where(width > 0, out_features, 0)  # a row with no adapter: untouched
    y = tl.load(y_ptr + row * stride_y + cols, mask=mask, other=0.0)
    tl.store(y_ptr + row * stride_y + cols, (y.to(tl.float32) + acc).to(y.dtype), mask=mask)


def _check(rows: torch.Tensor, table: torch.Tensor, widths: torch.Tensor,
           token_slots: torch.Tensor, rows_name: str, table_name: str) -> None:
    check_device(rows, table, widths, token_slots)
    if table.dim() != 3 or not table.is_contiguous() or table.dtype not in SUPPORTED_DTYPES:
        raise ValueError(f"{table_name} must be a contiguous [slots, width, features] table "
                         f"of {SUPPORTED_DTYPES}, got {tuple(table.shape)} {table.dtype}")
    if widths.dtype != torch.int64 or widths.shape != (table.shape[0],):
        raise ValueError(f"widths must be int64 [{table.shape[0]}] (one per slot), got "
                         f"{tuple(widths.shape)} {widths.dtype}")
    if token_slots.dtype != torch.int64 or token_slots.dim() != 1:
        raise ValueError(f"token_slots must be int64 [rows], got {tuple(token_slots.shape)} "
                         f"{token_slots.dtype}")
    if (rows.dim() != 2 or rows.shape[0] < token_slots.shape[0] or rows.stride(-1) != 1
            or rows.shape[1] != table.shape[2] or rows.dtype not in SUPPORTED_DTYPES):
        raise ValueError(f"{rows_name} must be [rows >= {token_slots.shape[0]}, "
                         f"{table.shape[2]}] with a contiguous last dim, got "
                         f"{tuple(rows.shape)} {rows.dtype}")


def lora_shrink(x: torch.Tensor, a: torch.Tensor, widths: torch.Tensor,
                token_slots: torch.Tensor) -> torch.Tensor:
    _check(x, a, widths, token_slots, "x", "a")
    num_rows, W = token_slots.shape[0], a.shape[1]
    u = torch.empty(num_rows, W, dtype=torch.float32, device=x.device)
    if num_rows:
        grid = (num_rows, triton.cdiv(W, _SHRINK_BLOCK_K))
        _shrink_kernel[grid](x, a, widths, token_slots, u, a.shape[2], W, x.stride(0),
                             BLOCK_K=_SHRINK_BLOCK_K, BLOCK_IN=_SHRINK_BLOCK_IN)
    return u


def lora_expand_(y: torch.Tensor, u: torch.Tensor, b_t: torch.Tensor, widths: torch.Tensor,
                 token_slots: torch.Tensor) -> None:
    _check(y, b_t, widths, token_slots, "y", "b_t")
    num_rows, W = token_slots.shape[0], b_t.shape[1]
    if u.dtype != torch.float32 or u.shape != (num_rows, W) or not u.is_contiguous():
        raise ValueError(f"u must be lora_shrink's contiguous float32 [{num_rows}, {W}], got "
                         f"{tuple(u.shape)} {u.dtype}")
    if num_rows:
        grid = (num_rows, triton.cdiv(b_t.shape[2], _EXPAND_BLOCK_OUT))
        _expand_kernel[grid](y, u, b_t, widths, token_slots, b_t.shape[2], W, y.stride(0),
                             BLOCK_OUT=_EXPAND_BLOCK_OUT, BLOCK_K=_EXPAND_BLOCK_K)

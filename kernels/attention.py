"""``paged_attention``: one launcher for prefill, chunked prefill and decode.

Picks tile sizes and the split-KV factor from host-side shapes and hints only
(no device sync, so the call can be captured in a CUDA graph when the hints
are fixed). Layout and semantics: see :mod:`paged_core.kernels`.
"""
from __future__ import annotations

import functools
import math

import torch
import triton

from paged_core.attention.kv_quant import as_bytes, is_quantized

from ._checks import check_cache, check_device, interpreting, next_pow2
from .attention_kernels import merge_splits_kernel, paged_attention_kernel

_MIN_SPLIT_CONTEXT = 1024  # below this a single pass is always cheap enough
_KEYS_PER_SPLIT = 512  # each split should still stream a useful amount of K/V
_MAX_SPLITS = 32
_MAX_SPLIT_TOKENS = 512  # bounds the float32 scratch of the split path
# A quantized cache's kernel arguments: KV_CODE, FP8_MBITS, FP8_BIAS (attention_kernels).
_KV_CODES = {torch.int8: (1, 0, 0), torch.float8_e4m3fn: (2, 3, 7),
             torch.float8_e5m2: (2, 2, 15)}


def choose_num_splits(work_items: int, max_seq_len: int, num_sms: int) -> int:
    """Split-KV factor for a grid of ``work_items`` programs over contexts up to ``max_seq_len``.

    Splitting pays only when the grid leaves streaming multiprocessors idle
    (few sequences x KV heads) and contexts are long; it then aims at about two
    programs per SM, keeping at least ``_KEYS_PER_SPLIT`` keys per split.
    """
    if work_items >= num_sms or max_seq_len < _MIN_SPLIT_CONTEXT:
        return 1
    by_occupancy = triton.cdiv(2 * num_sms, work_items)
    return max(1, min(by_occupancy, max_seq_len // _KEYS_PER_SPLIT, _MAX_SPLITS))


@functools.lru_cache(maxsize=None)
def _num_sms(device: torch.device) -> int:
    return torch.cuda.get_device_properties(device).multi_processor_count


# Launch shape of prefill programs, ``(BLOCK_M, TILE_N, num_warps, num_stages)`` for 16-bit
# dtypes with head_dim <= 128; ``None``: the defaults of ``_launch``. The GPU suite
# (``benchmarks/gpu_suite.py``) sets it to time candidate shapes.
PREFILL_SHAPE_OVERRIDE: tuple[int, int, int, int] | None = None


def _launch(is_decode: bool, group_pad: int, dim_pad: int,
            elem_size: int) -> tuple[int, int, int, int]:
    """``(BLOCK_M, TILE_N, num_warps, num_stages)``; tiles >= 16 so ``tl.dot`` shapes are
    valid on GPU.

    Sized so that, compiled for sm_90 with 4 warps, the usual shapes (16-bit
    dtypes, head_dim <= 256) need no register spills; K/V rows of ``row_bytes``
    wider than 128/256 bytes get narrower tiles.
    """
    row_bytes = dim_pad * elem_size
    if is_decode:
        return max(16, group_pad), (64 if row_bytes <= 256 else 32), 4, 3
    if PREFILL_SHAPE_OVERRIDE is not None and elem_size == 2 and dim_pad <= 128:
        block_m, tile_n, warps, stages = PREFILL_SHAPE_OVERRIDE
        return max(block_m, group_pad), tile_n, warps, stages
    block_m = 64 if elem_size == 2 and dim_pad <= 128 else 32
    return max(block_m, group_pad), (64 if row_bytes <= 128 else 32), 4, 3


def paged_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                    block_tables: torch.Tensor, seq_lens: torch.Tensor,
                    query_start_loc: torch.Tensor, scale: float,
                    sliding_window: int | None = None, *, num_splits: int | None = None,
                    max_seq_len: int | None = None, max_query_len: int | None = None,
                    out: torch.Tensor | None = None,
                    logits_soft_cap: float | None = None) -> torch.Tensor:
    """Attention of a packed step's queries over the paged cache (scores soft-capped to
    ``logits_soft_cap * tanh(s / logits_soft_cap)`` where given, as Gemma 2 does).

    ``q`` ``[num_tokens, num_heads, head_dim]`` in the cache dtype (any of float16,
    bfloat16, float32 over a quantized cache: ``paged_core.attention.kv_quant``, rows of
    ``head_dim + 4``); returns a new tensor of the same shape and dtype, or fills ``out``
    (same shape and dtype, last dim contiguous). Rows past ``query_start_loc[-1]``
    (padding) are left unwritten.

    Hints (host ints, never read from the device): ``max_seq_len`` bounds
    ``seq_lens`` (default: ``block_tables.shape[1] * block_size``) and
    ``max_query_len`` bounds query lengths (``1`` selects decode tiles). They
    only steer performance. ``num_splits`` forces the split-KV factor (``1``
    disables it); by default :func:`choose_num_splits` decides on CUDA.
    """
    _, block_size, kv_heads, head_dim = check_cache(k_cache, v_cache)
    check_device(q, k_cache, v_cache, block_tables, seq_lens, query_start_loc)
    if q.dim() != 3 or q.shape[2] != head_dim or q.shape[1] % kv_heads:
        raise ValueError(f"q must be [num_tokens, num_heads, {head_dim}] with num_heads a "
                         f"multiple of num_kv_heads={kv_heads}, got {list(q.shape)}")
    num_tokens, num_heads = q.shape[0], q.shape[1]
    num_seqs = seq_lens.shape[0]
    quantized = is_quantized(k_cache)
    if q.dtype != k_cache.dtype and not quantized:
        raise ValueError(f"q dtype {q.dtype} must match the cache dtype {k_cache.dtype}")
    if tuple(query_start_loc.shape) != (num_seqs + 1,) or block_tables.shape[0] != num_seqs:
        raise ValueError(f"query_start_loc must be [{num_seqs + 1}] and block_tables "
                         f"[{num_seqs}, max_blocks]; got {list(query_start_loc.shape)} and "
                         f"{list(block_tables.shape)}")
    if sliding_window is not None and sliding_window <= 0:
        raise ValueError(f"sliding_window must be a positive int or None, got {sliding_window}")
    if logits_soft_cap is not None and not logits_soft_cap > 0:
        raise ValueError(f"logits_soft_cap must be positive or None, got {logits_soft_cap}")
    if q.stride(2) != 1:
        q = q.contiguous()
    if out is None:
        out = torch.empty_like(q, memory_format=torch.contiguous_format)
    elif out.shape != q.shape or out.dtype != q.dtype or out.stride(2) != 1:
        raise ValueError(f"out must match q ({list(q.shape)}, {q.dtype}, last dim contiguous)")
    if num_tokens == 0 or num_seqs == 0:
        return out

    group = num_heads // kv_heads
    group_pad, dim_pad = next_pow2(group), next_pow2(head_dim, 16)
    is_decode = (max_query_len if max_query_len is not None else num_tokens - num_seqs + 1) <= 1
    block_m, tile_n, num_warps, num_stages = _launch(is_decode, group_pad, dim_pad,
                                                     q.element_size())
    block_q = block_m // group_pad
    if num_splits is None:
        work = max(num_seqs, triton.cdiv(num_tokens, block_q)) * kv_heads
        max_len = max_seq_len if max_seq_len is not None else block_tables.shape[1] * block_size
        num_splits = 1
        if q.device.type == "cuda" and num_tokens <= _MAX_SPLIT_TOKENS:
            num_splits = choose_num_splits(work, max_len, _num_sms(q.device))
    if num_splits < 1:
        raise ValueError(f"num_splits must be >= 1, got {num_splits}")

    split = num_splits > 1
    if split:
        partial = q.new_empty(num_tokens, num_heads, num_splits, head_dim, dtype=torch.float32)
        lse = q.new_empty(num_tokens, num_heads, num_splits, dtype=torch.float32)
        target, target_strides, lse_strides = partial, partial.stride()[:3], lse.stride()[:2]
    else:
        lse, target, target_strides, lse_strides = out, out, (*out.stride()[:2], 0), (0, 0)

    kv_code, fp8_mbits, fp8_bias = _KV_CODES.get(k_cache.dtype, (0, 0, 0))
    # A quantized cache as bytes, and as float32 for the scales at its rows' ends.
    k_scales, v_scales = (c.view(torch.float32) if quantized else c for c in (k_cache, v_cache))
    k_cache, v_cache = as_bytes(k_cache), as_bytes(v_cache)
    grid = (num_tokens // block_q + num_seqs, kv_heads, num_splits)
    paged_attention_kernel[grid](
        q, k_cache, v_cache, k_scales, v_scales, target, lse, block_tables, seq_lens,
        query_start_loc,
        num_seqs, num_splits, scale * math.log2(math.e), sliding_window or 0,
        scale / (logits_soft_cap or 1.0), (logits_soft_cap or 1.0) * math.log2(math.e),
        q.stride(0), q.stride(1), k_cache.stride(0), v_cache.stride(0), block_tables.stride(0),
        *target_strides, *lse_strides,
        NUM_KV_HEADS=kv_heads, GROUP=group, GROUP_PAD=group_pad, HEAD_DIM=head_dim,
        DIM_PAD=dim_pad, BLOCK_Q=block_q, BLOCK_M=block_m, BLOCK_SIZE=block_size, TILE_N=tile_n,
        HAS_WINDOW=sliding_window is not None, HAS_SOFT_CAP=logits_soft_cap is not None,
        SPLIT=split,
        # The interpreter's tl.dot is wrong on bfloat16 operands: upcast there only.
        UPCAST=interpreting() and q.dtype == torch.bfloat16,
        DOT_PRECISION="ieee" if q.dtype == torch.float32 else "tf32",
        ROW=k_cache.shape[-1], KV_CODE=kv_code, FP8_MBITS=fp8_mbits, FP8_BIAS=fp8_bias,
        num_warps=num_warps, num_stages=num_stages)
    if split:
        merge_splits_kernel[(num_tokens, num_heads)](
            partial, lse, out, query_start_loc, num_seqs, num_splits,
            *partial.stride()[:3], *lse.stride()[:2], out.stride(0), out.stride(1),
            SPLITS_PAD=next_pow2(num_splits), HEAD_DIM=head_dim, DIM_PAD=dim_pad)
    return out

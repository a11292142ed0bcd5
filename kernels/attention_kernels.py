"""Triton kernels behind :func:`paged_core.kernels.paged_attention`.

``paged_attention_kernel`` -- grid ``(num_q_blocks, num_kv_heads, num_splits)``.
A program owns ``BLOCK_Q`` consecutive new tokens of one sequence times the
``GROUP`` query heads sharing one KV head, packed as ``BLOCK_M = BLOCK_Q *
GROUP_PAD`` rows (row ``r``: token ``r // GROUP_PAD``, head ``r % GROUP_PAD``), so
each K/V tile is loaded once for the whole GQA group. Query blocks are numbered
without a host sync: sequence ``i``'s blocks start at ``query_start_loc[i] //
BLOCK_Q + i``, so ``num_tokens // BLOCK_Q + num_seqs`` programs always cover
the batch and a binary search over ``query_start_loc`` maps a program to its
sequence; surplus programs exit at once.

A quantized cache (``KV_CODE`` 1: int8, 2: fp8 with ``FP8_MBITS`` mantissa bits and bias
``FP8_BIAS``; ``paged_core.attention.kv_quant``) comes as bytes: rows of ``ROW = HEAD_DIM +
4`` bytes, the codes then the row's float32 scale, read through ``k_scale_ptr`` /
``v_scale_ptr`` (the same memory as float32). Codes decode exactly to float32 (then to the
query dtype, also exact); the K scale multiplies the scores, the V scale the probabilities.

The program walks its keys in tiles of ``TILE_N`` positions (independent of the
cache block size: each position looks up its own physical block) with an
online softmax in float32 (base-2 exponent). It visits only tiles that can be
unmasked: up to the last causal key of its rows and, with a sliding window,
from the first key inside the window of its first row.

With ``SPLIT`` the tile range is cut into ``num_splits`` contiguous parts,
one per program along grid axis 2 (flash-decoding); each part writes a
normalised float32 partial output and its base-2 log-sum-exp (``-inf`` when it
saw no key for a row), and ``merge_splits_kernel`` combines them. Rows with no
sequence (past ``query_start_loc[-1]``) are never written.
"""
from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def _find_seq(query_start_loc_ptr, num_seqs, pid, BLOCK_Q: tl.constexpr):
    """Largest ``i`` with ``query_start_loc[i] // BLOCK_Q + i <= pid``."""
    lo = 0
    hi = num_seqs
    while lo < hi:
        mid = (lo + hi) // 2
        if tl.load(query_start_loc_ptr + mid) // BLOCK_Q + mid <= pid:
            lo = mid + 1
        else:
            hi = mid
    return lo - 1


@triton.jit
def _decode(codes, KV_CODE: tl.constexpr, FP8_MBITS: tl.constexpr, FP8_BIAS: tl.constexpr):
    """Bytes of int8 (``KV_CODE`` 1) or fp8 codes (2) -> float32, exactly; an fp8 code is
    ``(e ? 2^MBITS + m : m) * 2^(max(e, 1) - BIAS - MBITS)``, the power of two built from
    its bits (never subnormal)."""
    if KV_CODE == 1:
        return codes.to(tl.int8, bitcast=True).to(tl.float32)
    x = codes.to(tl.int32)
    e = (x & 0x7F) >> FP8_MBITS
    m = x & ((1 << FP8_MBITS) - 1)
    mant = tl.where(e > 0, m + (1 << FP8_MBITS), m).to(tl.float32)
    pow2 = ((tl.maximum(e, 1) + (127 - FP8_BIAS - FP8_MBITS)) << 23).to(tl.float32, bitcast=True)
    return tl.where((x & 0x80) != 0, -mant * pow2, mant * pow2)


@triton.jit
def paged_attention_kernel(
        q_ptr, k_cache_ptr, v_cache_ptr, k_scale_ptr, v_scale_ptr, out_ptr, lse_ptr,
        block_tables_ptr, seq_lens_ptr, query_start_loc_ptr,
        num_seqs, num_splits, scale_log2, window, cap_scale, cap_log2,
        stride_qt, stride_qh, stride_kb, stride_vb, stride_bt,
        stride_ot, stride_oh, stride_os, stride_lt, stride_lh,
        NUM_KV_HEADS: tl.constexpr, GROUP: tl.constexpr, GROUP_PAD: tl.constexpr,
        HEAD_DIM: tl.constexpr, DIM_PAD: tl.constexpr, BLOCK_Q: tl.constexpr, BLOCK_M: tl.constexpr,
        BLOCK_SIZE: tl.constexpr, TILE_N: tl.constexpr, HAS_WINDOW: tl.constexpr,
        HAS_SOFT_CAP: tl.constexpr, SPLIT: tl.constexpr, UPCAST: tl.constexpr,
        DOT_PRECISION: tl.constexpr, ROW: tl.constexpr, KV_CODE: tl.constexpr,
        FP8_MBITS: tl.constexpr, FP8_BIAS: tl.constexpr):
    pid = tl.program_id(0)
    kv_head = tl.program_id(1)
    split = tl.program_id(2)
    seq = _find_seq(query_start_loc_ptr, num_seqs, pid, BLOCK_Q)
    q_start = tl.load(query_start_loc_ptr + seq)
    q_len = tl.load(query_start_loc_ptr + seq + 1) - q_start
    q_block = pid - (q_start // BLOCK_Q + seq)
    if q_block * BLOCK_Q >= q_len:
        return
    ctx_len = tl.load(seq_lens_ptr + seq) - q_len  # cached tokens before this step's

    rows = tl.arange(0, BLOCK_M)
    q_idx = q_block * BLOCK_Q + rows // GROUP_PAD
    head = kv_head * GROUP + rows % GROUP_PAD
    row_ok = (q_idx < q_len) & (rows % GROUP_PAD < GROUP)
    q_pos = ctx_len + q_idx
    dims = tl.arange(0, DIM_PAD)
    dim_ok = dims < HEAD_DIM
    q_off = (q_start + q_idx).to(tl.int64) * stride_qt + head * stride_qh
    q = tl.load(q_ptr + q_off[:, None] + dims[None, :],
                mask=row_ok[:, None] & dim_ok[None, :], other=0.0)
    if UPCAST:
        q = q.to(tl.float32)

    # Keys [kv_lo, kv_hi) can be visible to some row of this program.
    kv_hi = ctx_len + tl.minimum((q_block + 1) * BLOCK_Q, q_len)
    kv_lo = 0
    if HAS_WINDOW:
        kv_lo = tl.maximum(ctx_len + q_block * BLOCK_Q - window + 1, 0)
    tile_lo = kv_lo // TILE_N
    tile_hi = tl.cdiv(kv_hi, TILE_N)
    if SPLIT:
        per_split = tl.cdiv(tile_hi - tile_lo, num_splits)
        tile_lo = tile_lo + split * per_split
        tile_hi = tl.minimum(tile_lo + per_split, tile_hi)

    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, DIM_PAD], dtype=tl.float32)
    table = block_tables_ptr + seq.to(tl.int64) * stride_bt
    cols = tl.arange(0, TILE_N)
    for tile in range(tile_lo, tile_hi):
        k_pos = tile * TILE_N + cols
        k_ok = k_pos < kv_hi
        block = tl.load(table + k_pos // BLOCK_SIZE, mask=k_ok, other=0).to(tl.int64)
        kv_off = (k_pos % BLOCK_SIZE) * (NUM_KV_HEADS * ROW) + kv_head * ROW
        kv_mask = k_ok[None, :] & dim_ok[:, None]
        k = tl.load(k_cache_ptr + (block * stride_kb + kv_off)[None, :] + dims[:, None],
                    mask=kv_mask, other=0.0)  # [DIM_PAD, TILE_N]
        if KV_CODE != 0:
            k = _decode(k, KV_CODE, FP8_MBITS, FP8_BIAS).to(q.dtype)
        if UPCAST:
            k = k.to(tl.float32)
        s = tl.dot(q, k, input_precision=DOT_PRECISION)
        if KV_CODE != 0:  # a row's scale sits after its HEAD_DIM codes, 4-byte aligned
            k_scale = tl.load(k_scale_ptr + (block * stride_kb + kv_off + HEAD_DIM) // 4,
                              mask=k_ok, other=0.0)
            s = s * k_scale[None, :]
        if HAS_SOFT_CAP:  # cap * tanh(s * scale / cap), in log2 units: tanh(x) = 1 - 2 / (e^2x + 1)
            e2x = tl.math.exp2(s * (cap_scale * 2.8853900817779268))  # 2 / ln 2
            s = (1.0 - 2.0 / (e2x + 1.0)) * cap_log2
        else:
            s = s * scale_log2
        visible = k_ok[None, :] & (k_pos[None, :] <= q_pos[:, None])
        if HAS_WINDOW:
            visible = visible & (q_pos[:, None] - k_pos[None, :] < window)
        s = tl.where(visible, s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, axis=1))
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)  # row with nothing visible yet
        p = tl.math.exp2(s - m_safe[:, None])
        alpha = tl.math.exp2(m_i - m_safe)
        l_i = l_i * alpha + tl.sum(p, axis=1)
        v = tl.load(v_cache_ptr + (block * stride_vb + kv_off)[:, None] + dims[None, :],
                    mask=tl.trans(kv_mask), other=0.0)  # [TILE_N, DIM_PAD]
        if KV_CODE != 0:
            v_scale = tl.load(v_scale_ptr + (block * stride_vb + kv_off + HEAD_DIM) // 4,
                              mask=k_ok, other=0.0)
            p = p * v_scale[None, :]
            v = _decode(v, KV_CODE, FP8_MBITS, FP8_BIAS).to(q.dtype)
        p = p.to(v.dtype)
        if UPCAST:
            p = p.to(tl.float32)
            v = v.to(tl.float32)
        acc = acc * alpha[:, None] + tl.dot(p, v, input_precision=DOT_PRECISION)
        m_i = m_new

    out = acc / tl.where(l_i > 0, l_i, 1.0)[:, None]
    out_off = (q_start + q_idx).to(tl.int64) * stride_ot + head * stride_oh
    store_mask = row_ok[:, None] & dim_ok[None, :]
    if SPLIT:
        out_off += split * stride_os
        lse = tl.where(l_i > 0, m_i + tl.math.log2(tl.where(l_i > 0, l_i, 1.0)), float("-inf"))
        lse_off = (q_start + q_idx).to(tl.int64) * stride_lt + head * stride_lh + split
        tl.store(lse_ptr + lse_off, lse, mask=row_ok)
    tl.store(out_ptr + out_off[:, None] + dims[None, :], out.to(out_ptr.dtype.element_ty),
             mask=store_mask)


@triton.jit
def merge_splits_kernel(partial_ptr, lse_ptr, out_ptr, query_start_loc_ptr, num_seqs,
                        num_splits, stride_pt, stride_ph, stride_ps, stride_lt, stride_lh,
                        stride_ot, stride_oh, SPLITS_PAD: tl.constexpr, HEAD_DIM: tl.constexpr,
                        DIM_PAD: tl.constexpr):
    """Program ``(token, head)``: ``out = sum_s 2^lse_s * partial_s / sum_s 2^lse_s``.

    Every row of a real token saw at least its own key in some split, so the
    maximum log-sum-exp is finite; tokens past ``query_start_loc[-1]`` are skipped.
    """
    token = tl.program_id(0).to(tl.int64)
    head = tl.program_id(1)
    if token >= tl.load(query_start_loc_ptr + num_seqs):
        return
    splits = tl.arange(0, SPLITS_PAD)
    dims = tl.arange(0, DIM_PAD)
    lse = tl.load(lse_ptr + token * stride_lt + head * stride_lh + splits,
                  mask=splits < num_splits, other=float("-inf"))
    weight = tl.math.exp2(lse - tl.max(lse, axis=0))
    mask = (splits < num_splits)[:, None] & (dims < HEAD_DIM)[None, :]
    partial = tl.load(partial_ptr + token * stride_pt + head * stride_ph
                      + splits[:, None] * stride_ps + dims[None, :], mask=mask, other=0.0)
    out = tl.sum(partial * weight[:, None], axis=0) / tl.sum(weight, axis=0)
    tl.store(out_ptr + token * stride_ot + head * stride_oh + dims,
             out.to(out_ptr.dtype.element_ty), mask=dims < HEAD_DIM)

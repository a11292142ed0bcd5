"""Plain-torch reference versions of the kernels (slow, obviously correct).

Same arguments and semantics as :mod:`paged_core.kernels`; they read tensor
values on the host, so they are for tests and debugging, not for serving.
Attention is computed in float64 and cast to the query dtype. A quantized cache
(``paged_core.attention.kv_quant``) is written with ``quantize`` and read dequantized.
``shuffled_block_tables`` makes test inputs: block tables over scattered blocks.
"""
from __future__ import annotations

import torch

from paged_core.attention.kv_quant import as_bytes, dequantize, is_quantized, quantize


def write_kv_cache(key: torch.Tensor, value: torch.Tensor, k_cache: torch.Tensor,
                   v_cache: torch.Tensor, slot_mapping: torch.Tensor) -> None:
    """Store token ``t``'s K/V at slot ``slot_mapping[t]``; negative slots are skipped."""
    block_size = k_cache.shape[1]
    keep = slot_mapping >= 0
    slots = slot_mapping[keep].long()
    for cache, rows in ((k_cache, key[keep]), (v_cache, value[keep])):
        if is_quantized(cache):
            cache, rows = as_bytes(cache), as_bytes(quantize(rows, cache.dtype))
        cache[slots // block_size, slots % block_size] = rows.to(cache.dtype)


def copy_blocks(k_cache: torch.Tensor, v_cache: torch.Tensor, src: torch.Tensor,
                dst: torch.Tensor) -> None:
    """Copy block ``src[i]`` to ``dst[i]`` in both caches."""
    k_cache[dst.long()] = k_cache[src.long()]
    v_cache[dst.long()] = v_cache[src.long()]


def paged_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                    block_tables: torch.Tensor, seq_lens: torch.Tensor,
                    query_start_loc: torch.Tensor, scale: float,
                    sliding_window: int | None = None,
                    logits_soft_cap: float | None = None) -> torch.Tensor:
    """Per-sequence gather of the context, then masked softmax attention.

    Sequence ``i``'s new token ``j`` sits at position ``seq_lens[i] - q_len + j``
    and sees keys ``k`` with ``k <= pos`` and, with a window ``w``, ``pos - k < w``.
    With ``logits_soft_cap`` ``c`` (Gemma 2) the scaled scores ``s`` become
    ``c * tanh(s / c)`` before the softmax. Rows past ``query_start_loc[-1]`` are
    returned as zeros.
    """
    block_size = k_cache.shape[1]
    group = q.shape[1] // k_cache.shape[2]
    out = torch.zeros_like(q)
    starts = query_start_loc.tolist()
    for i, seq_len in enumerate(seq_lens.tolist()):
        q_seq = q[starts[i]:starts[i + 1]].double()
        q_len = q_seq.shape[0]
        if q_len == 0:
            continue
        blocks = block_tables[i, :(seq_len + block_size - 1) // block_size].long()
        k = _context(k_cache, blocks, seq_len).repeat_interleave(group, dim=1)
        v = _context(v_cache, blocks, seq_len).repeat_interleave(group, dim=1)
        scores = torch.einsum("qhd,khd->hqk", q_seq, k) * scale
        if logits_soft_cap is not None:
            scores = torch.tanh(scores / logits_soft_cap) * logits_soft_cap
        q_pos = torch.arange(seq_len - q_len, seq_len)[:, None]
        k_pos = torch.arange(seq_len)[None, :]
        visible = k_pos <= q_pos
        if sliding_window is not None:
            visible &= q_pos - k_pos < sliding_window
        scores = scores.masked_fill(~visible.to(scores.device), float("-inf"))
        out[starts[i]:starts[i + 1]] = torch.einsum(
            "hqk,khd->qhd", scores.softmax(dim=-1), v).to(q.dtype)
    return out


def _context(cache: torch.Tensor, blocks: torch.Tensor, seq_len: int) -> torch.Tensor:
    """The first ``seq_len`` rows of ``blocks`` ``[seq_len, kv_heads, head_dim]`` in float64."""
    rows = cache[blocks].flatten(0, 1)[:seq_len]
    return dequantize(rows, torch.float64) if is_quantized(cache) else rows.double()


def shuffled_block_tables(seq_lens: list[int], block_size: int, extra_blocks: int = 0,
                          generator: torch.Generator | None = None) -> tuple[torch.Tensor, int]:
    """Block tables for sequences of ``seq_lens`` tokens over physical blocks in random order.

    Every sequence owns ``ceil(seq_len / block_size)`` distinct blocks, no block
    is shared, and ``extra_blocks`` blocks belong to no sequence. Returns the
    ``int32`` tables ``[num_seqs, max blocks]`` (rows padded with 0) and the
    number of physical blocks.
    """
    blocks_per_seq = [-(-n // block_size) for n in seq_lens]
    num_blocks = sum(blocks_per_seq) + extra_blocks
    physical = torch.randperm(num_blocks, generator=generator).to(torch.int32)
    tables = torch.zeros(len(seq_lens), max(blocks_per_seq), dtype=torch.int32)
    used = 0
    for i, nb in enumerate(blocks_per_seq):
        tables[i, :nb] = physical[used:used + nb]
        used += nb
    return tables, num_blocks

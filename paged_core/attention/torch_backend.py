"""Attention in plain torch over the paged cache: the CPU path and the reference.

Cache layout (this backend's own, chosen for CPU matmuls): per layer
``[num_kv_heads, num_blocks, block_size, head_dim]``. Gathering a sequence's
blocks with one ``index_select`` then yields ``[kv_heads, S, L, D]`` with every
``[L, D]`` matrix contiguous, ready for batched matmuls without a copy.

A quantized cache (``kv_cache_dtype`` int8/fp8: ``kv_quant``, rows of ``head_dim + 4``
one-byte elements ending in their float32 scale) is quantized in ``write_kv`` (by the C++
op ``write_kv_slots`` where the kernel runs, else ``kv_quant.quantize``: the same bits) and
dequantized where it is read: inside the C++ kernel, or per gathered group below.

On the CPU, with float32 and bfloat16 queries, the whole step goes to one call of the C++
kernel (``cpu_kernels.py``: reads K/V straight from the paged cache, each query
only the keys it sees, online softmax in float32) when it builds here.

Otherwise (float16, another device, no compiler) a *plan* is built once per step
(shared by all layers): decodes (one query) and prefills (several queries,
possibly after a cached prefix), each grouped into up to ``_MAX_BUCKETS``
buckets of similar length (short ones are not padded to the longest). Per layer:

- decode buckets: the query heads of one KV head ride along a short query
  axis (grouped-query attention needs no K/V expansion); two matmuls around a
  float32 softmax;
- prefill buckets: queries padded to the longest chunk of their bucket, a
  causal + length (+ sliding-window) mask by absolute position, and
  ``scaled_dot_product_attention`` (memory-efficient for long prompts).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from ..cpu.extension import cpu_extension_available, cpu_ops
from ..cpu.isa import selected_cpu_isa
from ..cpu.kv_prefetch import selected_kv_prefetch
from .cpu_kernels import bf16_attention_amx, cpu_paged_attention
from .kv_quant import QUANTIZED_DTYPES, as_bytes, dequantize, is_quantized, quantize
from .metadata import AttentionMetadata

_MAX_BUCKETS = 4
_MIN_BUCKET_SEQS = 32
_CPU_KERNEL_DTYPES = (torch.float32, torch.bfloat16)


@dataclass
class _Group:
    """Sequences handled by one batched attention call."""

    token_index: torch.Tensor  # [S, Q] flat token index of each (padded) query
    valid: torch.Tensor  # [S, Q] bool, False for padding queries
    flat_blocks: torch.Tensor  # [S * B] physical blocks, B * block_size >= longest context
    mask: torch.Tensor  # [1, S, Q, L] bool, True where a query may attend a key
    masked_out: torch.Tensor  # ~mask


class TorchAttentionBackend:
    """Attention over the paged cache in its head-major layout (see the module doc).

    ``cpu_kernel`` (default: on) sends each step to the C++ kernel when the queries are CPU
    float32/bfloat16 (the cache: the same dtype, or quantized) and the kernel builds here;
    off, or where it cannot be used, the plain-torch path runs. Both compute the same attention.
    ``cpu_isa`` is the kernel build it uses (``paged_core.cpu.isa`` level, fixed at
    construction: the selected one by default), ``None`` without the kernel; ``amx_tiles``
    whether its bfloat16 tiles multiply on AMX (``bf16_attention_amx``, fixed likewise);
    ``decode_loop`` whether one-query units take the kernel's decode loop (batch-invariant
    mode turns it off: ``cpu_paged_attention``) and ``kv_prefetch`` how that loop starts K and
    V into L2 (``paged_core.cpu.kv_prefetch``, fixed at construction; the same bits either way).
    """

    name = "torch"

    def __init__(self, cpu_kernel: bool = True, cpu_isa: str | None = None) -> None:
        cpu_isa = cpu_isa or selected_cpu_isa()
        # Build the kernel now (once per machine, then cached) rather than in the first step.
        self.cpu_isa = cpu_isa if cpu_kernel and cpu_extension_available(cpu_isa) else None
        self.amx_tiles = self.cpu_isa is not None and bf16_attention_amx(self.cpu_isa)
        self.decode_loop = True
        self.kv_prefetch = selected_kv_prefetch()

    @property
    def cpu_kernel(self) -> bool:
        """True if steps on CPU float32/bfloat16 caches go to the C++ kernel."""
        return self.cpu_isa is not None

    @staticmethod
    def kv_cache_shape(num_blocks: int, block_size: int, num_kv_heads: int,
                       head_dim: int) -> tuple[int, ...]:
        return (num_kv_heads, num_blocks, block_size, head_dim)

    def write_kv(self, key: torch.Tensor, value: torch.Tensor, k_cache: torch.Tensor,
                 v_cache: torch.Tensor, meta: AttentionMetadata) -> None:
        slots = meta.slot_mapping
        if meta.has_padding:  # padding rows sit after the real tokens
            n = meta.num_scheduled_tokens
            key, value, slots = key[:n], value[:n], slots[:n]
        if is_quantized(k_cache):
            if self.uses_cpu_kernel(k_cache.device, key.dtype, k_cache.dtype):
                ops = cpu_ops(self.cpu_isa)  # the C++ decoder stack's own write
                ops.write_kv_slots(key, k_cache, slots)
                ops.write_kv_slots(value, v_cache, slots)
                return
            # rows of codes + scale, moved as bytes
            key, value = (as_bytes(quantize(x, k_cache.dtype)) for x in (key, value))
        heads, blocks, block_size, row = k_cache.shape
        for cache, rows in ((k_cache, key), (v_cache, value)):
            as_bytes(cache).view(heads, blocks * block_size, row).index_copy_(
                1, slots, rows.transpose(0, 1))

    def attend(self, query: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
               meta: AttentionMetadata, scale: float, sliding_window: int | None = None,
               logits_soft_cap: float | None = None) -> torch.Tensor:
        out = torch.empty_like(query)
        if meta.has_padding:
            out[meta.num_scheduled_tokens:] = 0
        if self.uses_cpu_kernel(k_cache.device, query.dtype, k_cache.dtype):
            return cpu_paged_attention(query, k_cache, v_cache, meta.block_tables, meta.seq_lens,
                                       meta.query_start_loc, scale, sliding_window, out=out,
                                       cpu_isa=self.cpu_isa, logits_soft_cap=logits_soft_cap,
                                       amx_tiles=self.amx_tiles, decode_loop=self.decode_loop,
                                       kv_prefetch=self.kv_prefetch)
        key = (self.name, sliding_window)
        plan = meta.backend_plans.get(key)
        if plan is None:
            plan = meta.backend_plans[key] = _make_plan(meta, k_cache.shape[2], sliding_window)
        for group in plan:
            _attend_group(query, k_cache, v_cache, group, scale, out, logits_soft_cap)
        return out

    def uses_cpu_kernel(self, device: torch.device, dtype: torch.dtype,
                        cache_dtype: torch.dtype | None = None) -> bool:
        """True if attention of ``dtype`` queries over a cache on ``device`` in ``cache_dtype``
        (default ``dtype``) goes to the C++ kernel."""
        cache_dtype = cache_dtype or dtype
        return (self.cpu_kernel and device.type == "cpu" and dtype in _CPU_KERNEL_DTYPES
                and cache_dtype in (dtype, *QUANTIZED_DTYPES))

    def copy_blocks(self, k_caches: list[torch.Tensor], v_caches: list[torch.Tensor],
                    src: torch.Tensor, dst: torch.Tensor) -> None:
        for cache in (*k_caches, *v_caches):
            cache[:, dst] = cache[:, src]


def _attend_group(query: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                  group: _Group, scale: float, out: torch.Tensor,
                  logits_soft_cap: float | None) -> None:
    num_seqs, num_queries = group.token_index.shape
    num_kv_heads, _, block_size, _ = k_cache.shape
    num_heads, head_dim = query.shape[1], query.shape[2]
    group_size = num_heads // num_kv_heads
    ctx = group.flat_blocks.numel() // num_seqs * block_size
    # [Hk, S, L, D], each [L, D] contiguous
    k, v = (_gather(cache, group.flat_blocks, query.dtype).view(num_kv_heads, num_seqs, ctx,
                                                                 head_dim)
            for cache in (k_cache, v_cache))
    q = query[group.token_index].view(num_seqs, num_queries, num_kv_heads, group_size, head_dim)
    if num_queries == 1:
        q = q[:, 0].transpose(0, 1)  # [Hk, S, G, D]
        o = _softmax_attention(q, k, v, group.masked_out, scale, logits_soft_cap)  # [Hk, S, G, D]
        out[group.token_index[:, 0]] = o.transpose(0, 1).reshape(num_seqs, num_heads, head_dim)
        return
    # Prefill: [Hk, S, Q * G, D] against [Hk, S, L, D]
    q = q.permute(2, 0, 1, 3, 4).reshape(num_kv_heads, num_seqs, num_queries * group_size, head_dim)
    mask = group.mask.repeat_interleave(group_size, dim=2) if group_size > 1 else group.mask
    if logits_soft_cap is None:
        o = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale)
    else:  # SDPA has no soft cap
        o = _softmax_attention(q, k, v, ~mask, scale, logits_soft_cap)
    o = o.view(num_kv_heads, num_seqs, num_queries, group_size, head_dim).permute(1, 2, 0, 3, 4)
    o = o.reshape(num_seqs, num_queries, num_heads, head_dim)
    out[group.token_index[group.valid]] = o[group.valid]


def _gather(cache: torch.Tensor, flat_blocks: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Blocks ``flat_blocks`` of one layer's cache, ``[Hk, len(flat_blocks), block_size, D]``
    in ``dtype`` (a quantized cache dequantized)."""
    blocks = cache.index_select(1, flat_blocks)
    return dequantize(blocks, dtype) if is_quantized(cache) else blocks


def _softmax_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                       masked_out: torch.Tensor, scale: float,
                       logits_soft_cap: float | None) -> torch.Tensor:
    """``softmax(scores) @ v``: float32 scores ``q k^T * scale`` (soft-capped where given),
    ``-inf`` where ``masked_out``."""
    scores = torch.matmul(q, k.transpose(-1, -2)).float() * scale
    if logits_soft_cap is not None:
        scores = torch.tanh(scores / logits_soft_cap) * logits_soft_cap
    probs = torch.softmax(scores.masked_fill_(masked_out, float("-inf")), dim=-1)
    return torch.matmul(probs.to(v.dtype), v)


def _make_plan(meta: AttentionMetadata, block_size: int,
               sliding_window: int | None) -> list[_Group]:
    query_lens, seq_lens = meta.query_lens_cpu, meta.seq_lens_cpu
    decode_rows = sorted((i for i, n in enumerate(query_lens) if n == 1), key=seq_lens.__getitem__)
    prefill_rows = sorted((i for i, n in enumerate(query_lens) if n > 1), key=query_lens.__getitem__)
    row_sets = _buckets(decode_rows, _MIN_BUCKET_SEQS) + _buckets(prefill_rows, 2)
    return [_make_group(meta, rows, block_size, sliding_window) for rows in row_sets]


def _buckets(sorted_rows: list[int], min_per_bucket: int) -> list[list[int]]:
    """Split rows (sorted by length) into at most ``_MAX_BUCKETS`` runs of similar length."""
    if not sorted_rows:
        return []
    count = max(1, min(_MAX_BUCKETS, len(sorted_rows) // min_per_bucket))
    size = -(-len(sorted_rows) // count)
    return [sorted_rows[i:i + size] for i in range(0, len(sorted_rows), size)]


def _make_group(meta: AttentionMetadata, rows: list[int], block_size: int,
                sliding_window: int | None) -> _Group:
    device = meta.slot_mapping.device
    starts = meta.query_start_loc_cpu
    qlens = [meta.query_lens_cpu[i] for i in rows]
    seq_lens = [meta.seq_lens_cpu[i] for i in rows]
    max_q, max_len = max(qlens), max(seq_lens)
    num_blocks = -(-max_len // block_size)
    row_index = torch.tensor(rows, device=device)
    flat_blocks = meta.block_tables[row_index, :num_blocks].reshape(-1).long()

    q_off = torch.arange(max_q, device=device)
    qlens_t = torch.tensor(qlens, device=device)
    valid = q_off[None, :] < qlens_t[:, None]
    token_index = torch.tensor([starts[i] for i in rows], device=device)[:, None] + \
        torch.where(valid, q_off, 0)
    # Absolute position of each query; keys are positions 0..num_blocks*block_size-1.
    positions = torch.tensor(seq_lens, device=device)[:, None] - qlens_t[:, None] + q_off[None, :]
    key_pos = torch.arange(num_blocks * block_size, device=device)
    mask = key_pos[None, None, :] <= positions[:, :, None]
    if sliding_window is not None:
        mask &= key_pos[None, None, :] > positions[:, :, None] - sliding_window
    mask &= valid[:, :, None]
    mask[:, :, 0] |= ~valid  # padding queries attend one key so softmax stays finite
    mask = mask.unsqueeze(0)
    return _Group(token_index, valid, flat_blocks, mask, ~mask)

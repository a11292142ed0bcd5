"""Attention in plain torch over the paged cache: the CPU path and the reference.

Per step it builds a *plan* once (shared by all layers): which sequences
decode (one query) and which prefill (several queries), gather indices for
their blocks, and boolean masks. Per layer it then runs at most two batched
``scaled_dot_product_attention`` calls:

- decodes: each sequence's blocks are gathered to ``[S, kv_heads, L, D]`` and
  the query heads of one KV head are treated as a short query axis, so grouped
  -query attention needs no K/V expansion;
- prefills (chunks, possibly after a cached prefix): queries padded to the
  longest chunk, causal + length (+ sliding-window) mask by absolute position.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from .metadata import AttentionMetadata


@dataclass
class _Group:
    """Sequences handled by one batched attention call."""

    token_index: torch.Tensor  # [S, Q] flat token index of each (padded) query
    valid: torch.Tensor  # [S, Q] bool, False for padding queries
    block_tables: torch.Tensor  # [S, B] physical blocks, B * block_size >= longest context
    mask: torch.Tensor  # [S, 1, Q, L] bool, True where a query may attend a key


@dataclass
class _Plan:
    decode: _Group | None
    prefill: _Group | None


class TorchAttentionBackend:
    name = "torch"

    def write_kv(self, key: torch.Tensor, value: torch.Tensor, k_cache: torch.Tensor,
                 v_cache: torch.Tensor, meta: AttentionMetadata) -> None:
        slots = meta.slot_mapping
        if meta.has_padded_slots:
            keep = slots >= 0
            key, value, slots = key[keep], value[keep], slots[keep]
        k_cache.view(-1, *k_cache.shape[2:]).index_copy_(0, slots, key)
        v_cache.view(-1, *v_cache.shape[2:]).index_copy_(0, slots, value)

    def attend(self, query: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
               meta: AttentionMetadata, scale: float,
               sliding_window: int | None = None) -> torch.Tensor:
        key = (self.name, sliding_window)
        plan = meta.backend_plans.get(key)
        if plan is None:
            plan = meta.backend_plans[key] = _make_plan(meta, k_cache.shape[1], sliding_window)
        out = torch.empty_like(query)
        for group in (plan.decode, plan.prefill):
            if group is not None:
                _attend_group(query, k_cache, v_cache, group, scale, out)
        return out

    def copy_blocks(self, k_caches: list[torch.Tensor], v_caches: list[torch.Tensor],
                    src: torch.Tensor, dst: torch.Tensor) -> None:
        for cache in (*k_caches, *v_caches):
            cache[dst] = cache[src]


def _attend_group(query: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                  group: _Group, scale: float, out: torch.Tensor) -> None:
    num_seqs, num_queries = group.token_index.shape
    _, block_size, num_kv_heads, head_dim = k_cache.shape
    num_heads = query.shape[1]
    group_size = num_heads // num_kv_heads
    ctx = group.block_tables.shape[1] * block_size
    # [S, L, Hk, D] -> [S, Hk, L, D]
    k = k_cache[group.block_tables].view(num_seqs, ctx, num_kv_heads, head_dim).transpose(1, 2)
    v = v_cache[group.block_tables].view(num_seqs, ctx, num_kv_heads, head_dim).transpose(1, 2)
    # [S, Q, Hq, D] -> [S, Hk, Q * G, D]: a KV head's query heads ride along the query axis.
    q = query[group.token_index].view(num_seqs, num_queries, num_kv_heads, group_size, head_dim)
    q = q.permute(0, 2, 1, 3, 4).reshape(num_seqs, num_kv_heads, num_queries * group_size, head_dim)
    mask = group.mask
    if group_size > 1:
        mask = mask.repeat_interleave(group_size, dim=2)
    o = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale)
    o = o.view(num_seqs, num_kv_heads, num_queries, group_size, head_dim).permute(0, 2, 1, 3, 4)
    o = o.reshape(num_seqs, num_queries, num_heads, head_dim)
    if num_queries == 1:
        out[group.token_index[:, 0]] = o[:, 0]
    else:
        out[group.token_index[group.valid]] = o[group.valid]


def _make_plan(meta: AttentionMetadata, block_size: int, sliding_window: int | None) -> _Plan:
    query_lens = meta.query_lens_cpu
    decode_rows = [i for i, n in enumerate(query_lens) if n == 1]
    prefill_rows = [i for i, n in enumerate(query_lens) if n > 1]
    return _Plan(
        decode=_make_group(meta, decode_rows, block_size, sliding_window),
        prefill=_make_group(meta, prefill_rows, block_size, sliding_window),
    )


def _make_group(meta: AttentionMetadata, rows: list[int], block_size: int,
                sliding_window: int | None) -> _Group | None:
    if not rows:
        return None
    device = meta.slot_mapping.device
    starts = [meta.query_start_loc_cpu[i] for i in rows]
    qlens = [meta.query_lens_cpu[i] for i in rows]
    seq_lens = [meta.seq_lens_cpu[i] for i in rows]
    max_q, max_len = max(qlens), max(seq_lens)
    num_blocks = -(-max_len // block_size)
    row_index = torch.tensor(rows, device=device)
    block_tables = meta.block_tables[row_index, :num_blocks].long()

    q_off = torch.arange(max_q, device=device)
    qlens_t = torch.tensor(qlens, device=device)
    valid = q_off[None, :] < qlens_t[:, None]
    token_index = torch.tensor(starts, device=device)[:, None] + torch.where(valid, q_off, 0)
    # Absolute position of each query; keys are positions 0..num_blocks*block_size-1.
    positions = torch.tensor(seq_lens, device=device)[:, None] - qlens_t[:, None] + q_off[None, :]
    key_pos = torch.arange(num_blocks * block_size, device=device)
    mask = key_pos[None, None, :] <= positions[:, :, None]
    if sliding_window is not None:
        mask &= key_pos[None, None, :] > positions[:, :, None] - sliding_window
    mask &= valid[:, :, None]
    mask[:, :, 0] |= ~valid  # padding queries attend one key so softmax stays finite
    return _Group(token_index, valid, block_tables, mask.unsqueeze(1))

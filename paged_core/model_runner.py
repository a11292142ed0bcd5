"""``ModelRunner``: owns the model and the KV cache tensors; runs one packed forward per step.

Input: the scheduler's list of (sequence, number of new tokens) and each
sequence's block ids. It builds the flat batch (token ids, positions,
``slot_mapping``, ``block_tables``, ``seq_lens``, ``query_start_loc``) with
numpy, runs the model once, and returns logits only for the rows that are
sampled (the last token of each sequence whose known tokens are all computed).

When the model asks for it (``prefers_bucketed_batches``: prepacked oneDNN
linears, which build a kernel for every new row count, ~0.4 ms per layer the
first time), the batch is padded up to a bucketed token count (padding rows:
token 0, position 0, slot -1), so a long-running server sees ~80 distinct
shapes instead of up to ``max_num_batched_tokens`` of them.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from .attention import AttentionBackend, AttentionMetadata
from .models.llama import LlamaForCausalLM


@dataclass
class StepInput:
    """One scheduled sequence as the runner needs it."""

    token_ids: list[int]  # the sequence's tokens so far (only new ones are read)
    num_computed_tokens: int
    num_new_tokens: int
    block_ids: list[int]
    needs_logits: bool


def bucketed_num_tokens(num_tokens: int) -> int:
    """Round up to a power of two up to 8, a multiple of 8 up to 256, then of 1/32 of the
    next power of two: under 8 padding rows up to 256 tokens, under 6.3% above; 83
    buckets up to 2048 tokens. Single-sequence decode (1 token) is never padded.
    """
    if num_tokens <= 8:
        return 1 << max(0, (num_tokens - 1).bit_length())
    step = max(8, 1 << max(0, (num_tokens - 1).bit_length() - 5))
    return -(-num_tokens // step) * step


def kv_cache_bytes_per_block(model: LlamaForCausalLM, block_size: int, dtype: torch.dtype) -> int:
    spec = model.spec
    element = torch.empty((), dtype=dtype).element_size()
    return 2 * spec.num_layers * block_size * spec.num_kv_heads * spec.head_dim * element


class ModelRunner:
    def __init__(self, model: LlamaForCausalLM, backend: AttentionBackend, num_blocks: int,
                 block_size: int, device: torch.device, dtype: torch.dtype) -> None:
        self.model = model
        self.backend = backend
        self.block_size = block_size
        self.device = device
        spec = model.spec
        shape = backend.kv_cache_shape(num_blocks, block_size, spec.num_kv_heads, spec.head_dim)
        self.kv_caches = [(torch.zeros(shape, dtype=dtype, device=device),
                           torch.zeros(shape, dtype=dtype, device=device))
                          for _ in range(spec.num_layers)]

    @torch.inference_mode()
    def execute(self, batch: list[StepInput], block_copies: list[tuple[int, int]]) -> torch.Tensor:
        """Run one step; returns float32 logits ``[num rows needing logits, vocab]`` in batch order."""
        if block_copies:
            src, dst = zip(*block_copies)
            self.backend.copy_blocks([k for k, _ in self.kv_caches], [v for _, v in self.kv_caches],
                                     torch.tensor(src, device=self.device),
                                     torch.tensor(dst, device=self.device))
        input_ids, positions, meta, logits_indices = self._prepare(batch)
        hidden = self.model(input_ids, positions, self.kv_caches, meta, self.backend)
        return self.model.compute_logits(hidden[logits_indices]).float()

    def _prepare(self, batch: list[StepInput]):
        bs = self.block_size
        qlens = np.fromiter((s.num_new_tokens for s in batch), dtype=np.int64, count=len(batch))
        starts = np.fromiter((s.num_computed_tokens for s in batch), dtype=np.int64, count=len(batch))
        seq_lens = starts + qlens
        query_start_loc = np.zeros(len(batch) + 1, dtype=np.int64)
        np.cumsum(qlens, out=query_start_loc[1:])
        num_tokens = int(query_start_loc[-1])
        padded = bucketed_num_tokens(num_tokens) if self.model.prefers_bucketed_batches else num_tokens

        input_ids = np.zeros(padded, dtype=np.int64)
        max_blocks = max(len(s.block_ids) for s in batch)
        block_tables = np.zeros((len(batch), max_blocks), dtype=np.int32)
        for row, s in enumerate(batch):
            lo, hi = s.num_computed_tokens, s.num_computed_tokens + s.num_new_tokens
            input_ids[query_start_loc[row]:query_start_loc[row + 1]] = s.token_ids[lo:hi]
            block_tables[row, :len(s.block_ids)] = s.block_ids
        rows = np.repeat(np.arange(len(batch)), qlens)
        positions = np.zeros(padded, dtype=np.int64)
        positions[:num_tokens] = np.arange(num_tokens) - query_start_loc[:-1][rows] + starts[rows]
        real = positions[:num_tokens]
        slot_mapping = np.full(padded, -1, dtype=np.int64)
        slot_mapping[:num_tokens] = block_tables[rows, real // bs].astype(np.int64) * bs + real % bs
        needs_logits = np.fromiter((s.needs_logits for s in batch), dtype=bool, count=len(batch))
        logits_indices = query_start_loc[1:][needs_logits] - 1

        to = lambda a: torch.from_numpy(a).to(self.device)  # noqa: E731
        meta = AttentionMetadata(
            slot_mapping=to(slot_mapping),
            block_tables=to(block_tables),
            seq_lens=to(seq_lens.astype(np.int32)),
            query_start_loc=to(query_start_loc.astype(np.int32)),
            max_query_len=int(qlens.max()),
            max_seq_len=int(seq_lens.max()),
            seq_lens_cpu=seq_lens.tolist(),
            query_lens_cpu=qlens.tolist(),
        )
        return to(input_ids), to(positions), meta, to(logits_indices)

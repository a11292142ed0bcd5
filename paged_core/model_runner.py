"""``ModelRunner``: owns the model and the KV cache tensors; runs one packed forward per step.

Input: the scheduler's list of (sequence, number of new tokens) and each
sequence's block ids. It builds the flat batch (token ids, positions,
``slot_mapping``, ``block_tables``, ``seq_lens``, ``query_start_loc``) with
numpy, runs the model once, and returns logits only for the rows that are
sampled (the last token of each sequence whose known tokens are all computed).
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

        input_ids = np.empty(num_tokens, dtype=np.int64)
        max_blocks = max(len(s.block_ids) for s in batch)
        block_tables = np.zeros((len(batch), max_blocks), dtype=np.int32)
        for row, s in enumerate(batch):
            lo, hi = s.num_computed_tokens, s.num_computed_tokens + s.num_new_tokens
            input_ids[query_start_loc[row]:query_start_loc[row + 1]] = s.token_ids[lo:hi]
            block_tables[row, :len(s.block_ids)] = s.block_ids
        rows = np.repeat(np.arange(len(batch)), qlens)
        positions = np.arange(num_tokens) - query_start_loc[:-1][rows] + starts[rows]
        slot_mapping = block_tables[rows, positions // bs].astype(np.int64) * bs + positions % bs
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

"""``AttentionMetadata``: what an attention backend needs to know about one packed step.

Built once per step by the model runner and shared by every layer. Model code
never sees block tables; it passes this object to the backend.

Layout invariants (all on the model's device):
- tokens of the step are packed back to back, sequence by sequence;
  ``query_start_loc[i]:query_start_loc[i+1]`` are sequence ``i``'s new tokens;
- ``seq_lens[i]`` is sequence ``i``'s total context after this step
  (cached tokens + new tokens), so its new tokens sit at positions
  ``seq_lens[i] - query_len_i .. seq_lens[i] - 1``;
- ``slot_mapping[t] = block * block_size + offset`` is where token ``t``'s K/V go;
- rows from ``num_scheduled_tokens`` on are padding (a batch rounded up to a
  bucketed size): their slot is ``-1`` (K/V not stored) and their attention
  output is unspecified;
- ``block_tables[i, j]`` is the physical block of sequence ``i``'s ``j``-th logical block
  (rows are padded with 0 past the sequence's last block).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

import torch


@dataclass
class AttentionMetadata:
    slot_mapping: torch.Tensor  # [num_tokens] int64
    block_tables: torch.Tensor  # [num_seqs, max_blocks] int32
    seq_lens: torch.Tensor  # [num_seqs] int32
    query_start_loc: torch.Tensor  # [num_seqs + 1] int32
    max_query_len: int
    max_seq_len: int
    # Host-side copies, so backends can plan without a device sync.
    seq_lens_cpu: list[int]
    query_lens_cpu: list[int]
    # Per-step plans a backend derives once and reuses in every layer, keyed by (backend name, options).
    backend_plans: dict[str, Any] = field(default_factory=dict)

    @property
    def num_seqs(self) -> int:
        return len(self.seq_lens_cpu)

    @cached_property
    def num_scheduled_tokens(self) -> int:
        """Real tokens of the step; the packed batch may hold padding rows after them."""
        return sum(self.query_lens_cpu)

    @property
    def has_padding(self) -> bool:
        return self.slot_mapping.shape[0] > self.num_scheduled_tokens

    @property
    def query_start_loc_cpu(self) -> list[int]:
        starts = [0]
        for n in self.query_lens_cpu:
            starts.append(starts[-1] + n)
        return starts

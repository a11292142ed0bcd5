"""What every proposer shares: which sequences get drafts, how many at most, and what it
knows of the engine it drafts for (``TargetModel``, never the engine itself).

A proposer runs after each step (``LLMEngine.step``) over the running
sequences and sets ``seq.spec_token_ids``; the scheduler may shorten them
(token budget, free blocks). Only a sequence whose known tokens are all
computed but the last (a decode) gets drafts, and never so many that a draft
position would reach ``max_total_tokens`` (the model's context or the KV
cache): ``len(drafts) <= max_total_tokens - num_tokens - 1``.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from ..core.sequence import Sequence


@dataclass(frozen=True)
class TargetModel:
    """The target model's engine as a proposer sees it: its settings (``EngineConfig``),
    vocabulary, context limit (``min(max_model_len, KV cache capacity)``), KV blocks, device
    and dtype."""

    config: Any
    vocab_size: int
    max_total_tokens: int
    num_blocks: int
    device: torch.device
    dtype: torch.dtype


def draft_limit(seq: Sequence, k: int, max_total_tokens: int) -> int:
    """How many drafts ``seq`` may get now (0: none)."""
    if seq.is_finished or seq.num_tokens - seq.num_computed_tokens != 1:
        return 0
    return max(0, min(k, max_total_tokens - seq.num_tokens - 1))


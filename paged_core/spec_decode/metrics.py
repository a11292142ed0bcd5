"""``SpecDecodingStats``: proposed / accepted draft token counters (vLLM's metric names).

``num_drafts`` counts verify steps of a sequence that had at least one draft,
``num_draft_tokens`` the drafts verified, ``num_accepted_tokens`` those
accepted (before stop conditions truncate the output), ``num_accepted_tokens_per_pos[i]``
how often the draft at position ``i`` was accepted. ``mean_acceptance_length``
is vLLM's ``1 + accepted / drafts``: tokens gained per verify step.
"""
from __future__ import annotations

from ..core.engine_stats import SpecDecodeStats


class SpecDecodingStats:
    def __init__(self, num_speculative_tokens: int) -> None:
        self.num_drafts = 0
        self.num_draft_tokens = 0
        self.num_accepted_tokens = 0
        self.num_accepted_tokens_per_pos = [0] * num_speculative_tokens

    def observe(self, num_draft_tokens: int, num_accepted_tokens: int) -> None:
        if num_draft_tokens == 0:
            return
        self.num_drafts += 1
        self.num_draft_tokens += num_draft_tokens
        self.num_accepted_tokens += num_accepted_tokens
        for pos in range(num_accepted_tokens):
            self.num_accepted_tokens_per_pos[pos] += 1

    def snapshot(self) -> SpecDecodeStats:
        """The counters now, as ``stats()`` reports them."""
        drafts = self.num_drafts
        return SpecDecodeStats(
            spec_decode_num_drafts=drafts,
            spec_decode_num_draft_tokens=self.num_draft_tokens,
            spec_decode_num_accepted_tokens=self.num_accepted_tokens,
            spec_decode_mean_acceptance_length=1 + self.num_accepted_tokens / drafts if drafts else 0.0,
            spec_decode_draft_acceptance_rate=(self.num_accepted_tokens / self.num_draft_tokens
                                               if self.num_draft_tokens else 0.0),
        )

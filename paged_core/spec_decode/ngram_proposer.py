"""``NgramProposer``: prompt lookup decoding (vLLM's ``method: "ngram"``), no extra model.

For each sequence it looks for the longest n-gram, ``prompt_lookup_min <= n <=
prompt_lookup_max``, that ends the sequence's tokens (prompt + output) and also
occurs earlier in them; the tokens that followed its earliest occurrence (at
most ``k``) are the drafts, as in vLLM. No match: no drafts. No torch: a
numpy scan finds the earlier positions of the last token, then each candidate is
extended leftwards (``O(len(tokens) + matches * prompt_lookup_max)`` per sequence).
"""
from __future__ import annotations

import numpy as np

from ..core.sequence import Sequence
from .config import SpeculativeConfig
from .proposer import draft_limit


class NgramProposer:
    def __init__(self, config: SpeculativeConfig, max_total_tokens: int) -> None:
        self.min_n = config.prompt_lookup_min
        self.max_n = config.prompt_lookup_max
        self.k = config.num_speculative_tokens
        self.max_total_tokens = max_total_tokens

    def propose(self, seqs: list[Sequence]) -> None:
        """Set ``spec_token_ids`` of every running sequence (``[]`` when nothing matches)."""
        for seq in seqs:
            limit = draft_limit(seq, self.k, self.max_total_tokens)
            seq.spec_token_ids = self.propose_tokens(seq.token_ids, limit) if limit else []

    def propose_tokens(self, token_ids: list[int], k: int | None = None) -> list[int]:
        """At most ``k`` (default ``num_speculative_tokens``) drafts to follow ``token_ids``."""
        k = self.k if k is None else k
        n_tokens = len(token_ids)
        if k <= 0 or n_tokens <= self.min_n:
            return []
        max_n = min(self.max_n, n_tokens - 1)
        tokens = np.asarray(token_ids)
        # Earlier positions holding the last token, earliest first; extend each match leftwards.
        ends = np.flatnonzero(tokens[self.min_n - 1:n_tokens - 1] == tokens[-1]) + self.min_n - 1
        best_n, best_end = 0, -1
        for end in ends.tolist():
            n = 1
            while n < max_n and end - n >= 0 and token_ids[end - n] == token_ids[n_tokens - 1 - n]:
                n += 1
            if n > best_n and n >= self.min_n:
                best_n, best_end = n, end
                if n == max_n:
                    break
        if best_end < 0:
            return []
        return list(token_ids[best_end + 1:best_end + 1 + k])

"""Incremental detokenization that is correct for multi-byte characters while streaming.

Tokens are decoded in a short sliding window (``prefix_offset:read_offset`` is
text already emitted, kept as context so tokenizers that merge spaces or
bytes across tokens decode the same as a full decode). New text is released
only once it no longer ends in U+FFFD, i.e. once a multi-byte character's
last byte has arrived.
"""
from __future__ import annotations

from .token_decoder import token_decoder

_CONTEXT_TOKENS = 5
_REPLACEMENT = "\ufffd"


class IncrementalDetokenizer:
    def __init__(self, tokenizer, prompt_token_ids: list[int], skip_special_tokens: bool) -> None:
        self.decode = token_decoder(tokenizer, skip_special_tokens)
        self.read_offset = len(prompt_token_ids)
        self.prefix_offset = max(self.read_offset - _CONTEXT_TOKENS, 0)

    def step(self, token_ids: list[int], end: int, final: bool = False) -> str:
        """Text added by ``token_ids[:end]`` since the last call.

        ``token_ids`` is the sequence's whole token list (prompt included); ``end`` grows
        from call to call. With ``final`` the pending tail is flushed even if it is an
        incomplete character.
        """
        prefix = self.decode(token_ids[self.prefix_offset:self.read_offset])
        full = self.decode(token_ids[self.prefix_offset:end])
        if len(full) <= len(prefix) or (full.endswith(_REPLACEMENT) and not final):
            return ""
        delta = full[len(prefix):]
        self.prefix_offset = self.read_offset
        self.read_offset = end
        return delta

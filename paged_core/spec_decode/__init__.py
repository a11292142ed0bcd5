"""Speculative decoding (vLLM's ``speculative_config``): proposers and verification.

``config`` validates the user's dict; ``ngram_proposer`` (prompt lookup) and
``draft_model_proposer`` (a small model with the same tokenizer, on its own
paged KV cache) propose draft tokens after each step; the scheduler gives a
sequence with drafts ``1 + len(drafts)`` new tokens, the verify step is the
ordinary packed forward with logits at each of those positions, and
``rejection_sampler`` keeps the longest accepted prefix plus one target token.
"""
from .config import SpeculativeConfig

__all__ = ["SpeculativeConfig"]

"""``make_proposer``: the proposer a ``SpeculativeConfig`` names (vLLM's ``method``).

Its own module so that ``proposer`` (what every proposer shares) is imported by the
proposers and never imports them back.
"""
from __future__ import annotations

from .draft_model_proposer import DraftModelProposer
from .ngram_proposer import NgramProposer


def make_proposer(config, engine):
    """The proposer for ``config.method`` (``engine`` gives the draft model its settings)."""
    if config.method == "ngram":
        return NgramProposer(config, engine.max_total_tokens)
    return DraftModelProposer(config, engine)

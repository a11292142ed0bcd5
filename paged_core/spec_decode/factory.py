"""``make_proposer``: the proposer a ``SpeculativeConfig`` names (vLLM's ``method``).

Its own module so that ``proposer`` (what every proposer shares) is imported by the
proposers and never imports them back.
"""
from __future__ import annotations

from .draft_model_proposer import DraftModelProposer
from .ngram_proposer import NgramProposer
from .proposer import TargetModel


def make_proposer(config, target: TargetModel):
    """The proposer for ``config.method``, drafting for ``target``."""
    if config.method == "ngram":
        return NgramProposer(config, target.max_total_tokens)
    return DraftModelProposer(config, target)

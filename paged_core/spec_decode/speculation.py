"""``Speculation``: speculative decoding as the engine runs it, apart from plain decoding.

After a step, its proposer drafts tokens for the running sequences whose request allows it
(``may_draft``); the next step computes them beside the last token; then ``verify`` keeps
the drafts the target model agrees with and one more (``rejection_sampler``), and counts
them (``SpecDecodingStats``). A sequence without drafts never comes here.
"""
from __future__ import annotations

from ..core.engine_stats import SpecDecodeStats
from ..core.sequence import Sequence
from .factory import make_proposer
from .metrics import SpecDecodingStats
from .proposer import TargetModel
from .rejection_sampler import num_accepted


class Speculation:
    def __init__(self, config, target: TargetModel) -> None:
        """``config``: the ``SpeculativeConfig``; ``target``: the engine it drafts for."""
        self.proposer = make_proposer(config, target)
        self.counters = SpecDecodingStats(config.num_speculative_tokens)

    def propose(self, running: list[Sequence]) -> None:
        """Draft for every running sequence whose request allows drafting."""
        self.proposer.propose([seq for seq in running if seq.request.may_draft(seq)])

    def verify(self, seq: Sequence, sampled: list[int]) -> int:
        """How many of ``sampled`` (one token per verified position) ``seq`` keeps: the
        accepted drafts and one more. Consumes and counts the drafts."""
        accepted = num_accepted(seq.spec_token_ids, sampled)
        self.counters.observe(len(seq.spec_token_ids), accepted)
        seq.spec_token_ids = []
        return accepted + 1

    def stats(self) -> SpecDecodeStats:
        return self.counters.snapshot()

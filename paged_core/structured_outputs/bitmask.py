"""``GrammarBitmask``: masks every constrained logits row of a step in one batched pass.

Called by the sampler before penalties and sampling (greedy included): the
matchers of the constrained rows fill one int32 bitmask on the CPU together
(xgrammar's ``BatchGrammarMatcher``), it moves to the logits' device once, and
``apply_token_bitmask_inplace`` sets every token the grammar forbids to -inf.
Unconstrained rows are left untouched. Tokens the grammar allows keep their
logits exactly, so the mask never changes the choice among allowed tokens.
"""
from __future__ import annotations

import torch
import xgrammar as xgr

from .matcher import SequenceGrammar


class GrammarBitmask:
    def __init__(self) -> None:
        self._batch: xgr.BatchGrammarMatcher | None = None  # its thread pool, made on first use

    def __call__(self, logits: torch.Tensor, grammars: list[SequenceGrammar | None]) -> None:
        rows = [r for r, g in enumerate(grammars) if g is not None]
        if not rows:
            return
        if self._batch is None:
            self._batch = xgr.BatchGrammarMatcher()
        bitmask = xgr.allocate_token_bitmask(logits.shape[0], logits.shape[1])
        self._batch.batch_fill_next_token_bitmask([grammars[r].matcher for r in rows], bitmask,
                                                  indices=rows)
        xgr.apply_token_bitmask_inplace(logits, bitmask.to(logits.device, non_blocking=True),
                                        vocab_size=logits.shape[1], indices=rows)

"""``SequenceGrammar``: the grammar state of one sequence (one xgrammar ``GrammarMatcher``).

Invariant: the matcher has accepted exactly the sequence's output tokens, in
order. Forking (``n > 1``) deep-copies the state, so each sample goes on from
where its parent was. Preemption by recompute keeps a sequence's tokens, so it
keeps its matcher as is: the state still matches the tokens, and the next
sampled token continues the same parse.
"""
from __future__ import annotations

import xgrammar as xgr


class SequenceGrammar:
    def __init__(self, matcher: xgr.GrammarMatcher) -> None:
        self.matcher = matcher

    @classmethod
    def start(cls, compiled: xgr.CompiledGrammar) -> "SequenceGrammar":
        return cls(xgr.GrammarMatcher(compiled))

    def fork(self) -> "SequenceGrammar":
        return SequenceGrammar(self.matcher.fork())

    def accept(self, token: int) -> bool:
        """Advance by one sampled token; True once the grammar has ended (its stop token
        accepted). Raises ``RuntimeError`` for a token the grammar refuses: the bitmask
        never allows one, so that is a bug, and it fails this request only."""
        if not self.matcher.accept_token(token):
            raise RuntimeError(f"the grammar refused sampled token {token}")
        return self.matcher.is_terminated()

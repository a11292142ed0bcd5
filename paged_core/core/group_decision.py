"""What a request kind decides for a sequence that samples this step; the engine applies it.

Every kind of request is a group of sequences (``SequenceGroup``): a sampling request
(``Request``: ``n >= 1`` samples, forked from the prompt once it is computed) and a beam
search (``BeamSearchRequest``: ``beam_width`` beams, forked and dropped every step). Before
the forward, a kind decides for each of its sequences that computes its last token
(``plan_sampling``) which sequences to fork from it and which the sampler draws a token
for from its row, or that it wants the raw logits row back; a kind that asked gets the row
after the forward (``take_logits``) and decides then. It never touches the KV cache
manager or the scheduler: after the forward, the engine applies each ``GroupDecision``
(``LLMEngine._apply``) in a fixed order: forks first (a child shares its parent's blocks
by reference, so they are shared before any parent is freed; it gets as many computed
tokens as its parent has), then frees.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol

from .sequence import Sequence


@dataclass
class GroupDecision:
    """One request kind's decision. Invariant: a child of ``forks`` is a new sequence of the
    group whose tokens are its parent's (plus, for a beam, the token it continues with)."""

    forks: list[tuple[Sequence, Sequence]] = field(default_factory=list)  # (parent, child)
    freed: list[Sequence] = field(default_factory=list)  # sequences that end: blocks freed
    to_sample: list[Sequence] = field(default_factory=list)  # draw a token from the same row
    needs_logits: bool = False  # hand the sequence's raw logits row to ``take_logits``
    num_tokens: int = 0  # tokens the kind appended itself (a beam step's continuations)
    output_ready: bool = False  # the group has an output to report now (a search that ended)


class SequenceGroup(Protocol):
    """What the engine asks of every kind of request."""

    request_id: str

    @property
    def sequences(self) -> list[Sequence]:
        """The group's live sequences."""

    @property
    def is_finished(self) -> bool:
        """True once no sequence of the group will run again."""

    def may_draft(self, seq: Sequence) -> bool:
        """Whether speculative decoding may draft tokens for ``seq``."""

    def may_schedule_ahead(self, seq: Sequence) -> bool:
        """Whether ``seq``, sampled in the step just launched, may be scheduled again before
        that step's token reaches the host (``schedule_ahead``)."""

    def plan_sampling(self, seq: Sequence) -> GroupDecision:
        """``seq`` computes its last token this step: decide, before the forward, what its
        logits row is for. Called once per step for each such sequence."""

    def take_logits(self, seq: Sequence, logits: Any) -> GroupDecision:
        """``seq``'s next-token logits row (a float tensor; the core never reads it), after
        the forward; called only where ``plan_sampling`` set ``needs_logits``."""

    def abort(self, reason: str = "abort") -> None:
        """End the group with ``reason``; the engine then frees its live sequences."""

    def final_outputs(self) -> list[Any]:
        """The ``EngineCoreOutput``s that report the group ended (a search's ranked beams,
        every sample's finish reason)."""

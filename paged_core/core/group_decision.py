"""What a request kind decides when one of its sequences' logits come in; the engine applies it.

Every kind of request is a group of sequences (``SequenceGroup``): a sampling request
(``Request``: ``n >= 1`` samples, forked from the prompt once it is computed) and a beam
search (``BeamSearchRequest``: ``beam_width`` beams, forked and dropped every step). A kind
decides, from a sequence's logits row, which sequences to fork, which to drop and which
the sampler draws a token for; it never touches the KV cache manager or the scheduler.
The engine applies each ``GroupDecision`` (``LLMEngine._apply``) in a fixed order: forks
first (a child shares its parent's blocks by reference, so they are shared before any
parent is freed), then frees.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol

from .sequence import Sequence


@dataclass
class GroupDecision:
    """One request kind's decision. Invariant: a child of ``forks`` is a new sequence of the
    group that has as many computed tokens as its parent, whose blocks hold them."""

    forks: list[tuple[Sequence, Sequence]] = field(default_factory=list)  # (parent, child)
    freed: list[Sequence] = field(default_factory=list)  # sequences that end: blocks freed
    to_sample: list[Sequence] = field(default_factory=list)  # draw a token from the same row
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

    def take_logits(self, seq: Sequence, logits: Any) -> GroupDecision:
        """``seq``'s next-token logits row (a float tensor; the core never reads it) is in:
        decide. Called once per step for each sequence that computed its last token."""

    def abort(self, reason: str = "abort") -> None:
        """End the group with ``reason``; the engine then frees its live sequences."""

    def make_output(self) -> Any:
        """The group's ``RequestOutput`` now (deltas since the previous one, where it streams)."""

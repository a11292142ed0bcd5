"""What crosses the seam between the front end and the engine core (vLLM v1's
``EngineCoreRequest`` / ``EngineCoreOutput``).

In: an ``EngineRequest``, made once by the input processor (prompt tokenized, params
checked against the model, grammar compiled) and frozen from then on. The core reads its
token ids and params, never its text.

Out: ``EngineCoreOutput``s, one per sample that changed in a step: the token ids appended
(and their log-probabilities), the finish reason once the core ends the sample; a beam
search's one output holds its ranked beams instead. The output processor turns them into
text and ``RequestOutput`` deltas; a stop string it finds goes back as a ``StopAtString``.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from ..beam_search.params import BeamSearchParams
from ..exceptions import ParamValidationError
from ..param_checks import check_utf8
from ..sampling_params import SamplingParams

PRIORITY_LIMIT = 2**31


@dataclass(frozen=True)
class EngineRequest:
    """One request as the core takes it. Invariants (checked by the input processor and
    here): ``prompt_token_ids`` is non-empty and within the vocabulary and the context;
    ``priority`` is an ``int`` in ``[-2**31, 2**31]``; ``compiled_grammar`` is set exactly
    when a ``SamplingParams`` asks for ``structured_outputs``."""

    request_id: str
    prompt_token_ids: tuple[int, ...]
    params: SamplingParams | BeamSearchParams
    eos_token_ids: frozenset[int]
    compiled_grammar: Any = None  # xgrammar's CompiledGrammar
    priority: int = 0  # vLLM's: lower is scheduled first (scheduling_policy "priority")
    tenant: str | None = None  # who sent it (the OpenAI ``user``), for tenant_fairness
    arrival_time: float = field(default_factory=time.monotonic)
    deadline: float | None = None  # on time.monotonic()'s clock; AsyncEngine expires it
    cache_salt: str | None = None  # prefix-cache hits only between requests with equal salt
    lora_id: int | None = None  # the adapter the request runs under (None: the base model)
    prompt: str | None = None  # the prompt's text, for the output processor only
    # the token ids of each spelling of the params' bad_words (sample.bad_words)
    bad_words_token_ids: tuple[tuple[int, ...], ...] = ()

    def __post_init__(self) -> None:
        priority = self.priority
        if isinstance(priority, bool) or not isinstance(priority, int) \
                or abs(priority) > PRIORITY_LIMIT:
            raise ParamValidationError(
                f"priority must be an integer in [-2**31, 2**31], got {priority!r}", "priority")
        if self.cache_salt is not None and (not isinstance(self.cache_salt, str)
                                            or not self.cache_salt):
            raise ParamValidationError(
                f"cache_salt must be a non-empty string, got {self.cache_salt!r}", "cache_salt")
        if self.cache_salt is not None:  # it is hashed as UTF-8 with the prompt's blocks
            check_utf8("cache_salt", self.cache_salt)

    @property
    def is_beam_search(self) -> bool:
        return isinstance(self.params, BeamSearchParams)


@dataclass(frozen=True)
class EngineCoreOutput:
    """What the core did for one sample of one request in a step (``index``: the sample,
    ``0..n-1``; 0 for a beam search). ``new_token_ids`` were appended after the previous
    output's; ``finish_reason`` is set once the core ended the sample ("stop", "length",
    "abort"). A beam search reports once, with its ``beams`` (``RankedBeam``s, best first).
    ``error`` is set when handling the request raised inside the core: it is finished and
    its blocks are freed."""

    request_id: str
    index: int = 0
    new_token_ids: list[int] = field(default_factory=list)
    new_logprobs: list[Any] = field(default_factory=list)  # TokenLogprobs | None per token
    finish_reason: str | None = None
    stop_reason: int | str | None = None
    num_cached_tokens: int = 0
    first_scheduled_time: float | None = None
    first_token_time: float | None = None
    beams: list[Any] | None = None
    error: BaseException | None = None


@dataclass(frozen=True)
class StopAtString:
    """The output processor found ``stop`` in sample ``index`` of ``request_id`` after its
    output token ``num_output_tokens``: the core ends the sample there, dropping the
    ``num_dropped`` tokens it had appended after that one."""

    request_id: str
    index: int
    num_output_tokens: int
    num_dropped: int
    stop: str

"""Sampling parameters of one request, validated at construction.

Names and defaults follow vLLM's ``SamplingParams`` so that its users feel at
home. Every invalid value raises ``ParamValidationError`` (a ``ValueError``) whose
``param`` is the field and whose message names it and the allowed range; servers
turn it into a 400 naming ``param``, the message as is. Values are checked twice: on their own at construction (types, ranges, finite numbers),
and against the model and the prompt by ``verify_for_model`` (token ids in the
vocabulary, lengths within the context), so nothing that reaches the engine
can fail a whole step.
"""
from __future__ import annotations

import enum
from dataclasses import dataclass, fields
from typing import Any

from .beam_search.params import BeamSearchParams
from .exceptions import ParamValidationError
from .param_checks import (as_list, as_token_biases, check_bool, check_int, check_number,
                           check_utf8)
from .structured_outputs.params import StructuredOutputsParams

__all__ = ["BeamSearchParams", "RequestOutputKind", "SamplingParams"]  # BeamSearchParams: importable here, as in vLLM

_GREEDY_EPS = 1e-5
SEED_MIN, SEED_MAX = -(1 << 63), (1 << 64) - 1  # what torch.Generator.manual_seed takes
_SEED_MODULUS = 1 << 64


class RequestOutputKind(enum.IntEnum):
    """What each ``RequestOutput`` of a running request holds (vLLM's names and values).

    ``CUMULATIVE``: everything so far (``delta_*`` fields: what is new); ``DELTA``: only
    what is new since the previous output; ``FINAL_ONLY``: no output until the request
    finishes, then everything (``LLM.generate`` runs every request so).
    """

    CUMULATIVE = 0
    DELTA = 1
    FINAL_ONLY = 2


@dataclass
class SamplingParams:
    """How to pick the next tokens of a request and when to stop.

    ``temperature == 0`` means greedy decoding; ``top_k`` of 0 or -1 disables
    top-k; ``stop`` strings end the output and are not included in it.
    ``logit_bias`` adds its bias to each listed token's logit (keys: token ids, or their
    decimal strings; -100 all but bans a token), ``allowed_token_ids`` (not empty) lets
    only those tokens be sampled, and ``bad_words`` are words the output never completes
    (``sample.bad_words``); all apply to every sampled token, after the grammar of
    ``structured_outputs`` and before the penalties, as in vLLM. ``truncate_prompt_tokens``
    ``k`` keeps only the prompt's last ``k`` tokens (-1: the last ``max_model_len``).
    """

    n: int = 1
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    min_p: float = 0.0
    repetition_penalty: float = 1.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    seed: int | None = None
    stop: str | list[str] | None = None
    stop_token_ids: list[int] | None = None
    max_tokens: int | None = 16
    min_tokens: int = 0
    ignore_eos: bool = False
    logprobs: int | None = None
    skip_special_tokens: bool = True
    include_stop_str_in_output: bool = False
    structured_outputs: StructuredOutputsParams | None = None  # a JSON object is accepted too
    output_kind: RequestOutputKind = RequestOutputKind.CUMULATIVE  # its value (0-2) too
    logit_bias: dict[int, float] | None = None
    allowed_token_ids: list[int] | None = None
    bad_words: list[str] | None = None
    truncate_prompt_tokens: int | None = None

    def __post_init__(self) -> None:
        if self.structured_outputs is not None:
            self.structured_outputs = StructuredOutputsParams.from_dict(self.structured_outputs)
        self.stop = as_list("stop", [self.stop] if isinstance(self.stop, str) else self.stop)
        self.stop_token_ids = as_list("stop_token_ids", self.stop_token_ids)
        if self.top_k == -1:
            self.top_k = 0
        self.output_kind = _output_kind(self.output_kind)
        self.logit_bias = as_token_biases("logit_bias", self.logit_bias)
        if self.allowed_token_ids is not None:
            self.allowed_token_ids = as_list("allowed_token_ids", self.allowed_token_ids)
        if self.bad_words is not None:
            self.bad_words = as_list("bad_words", self.bad_words)
        self._validate()

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> "SamplingParams":
        """Build from a JSON-like dict, rejecting unknown field names."""
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(values) - known)
        if unknown:
            raise ParamValidationError(
                f"unknown sampling parameter(s) {unknown}; allowed: {sorted(known)}", unknown[0])
        return cls(**values)

    @property
    def greedy(self) -> bool:
        return self.temperature < _GREEDY_EPS

    def sample_seed(self, index: int) -> int | None:
        """The seed of sample ``index`` (``0..n-1``): ``(seed + index) mod 2**64``.

        Always inside ``[0, 2**64)``, which every ``torch.Generator`` accepts, so
        ``n > 1`` never overflows, even for ``seed = 2**64 - 1``; for sample 0 it
        gives the same generator as ``manual_seed(seed)``. ``None`` when unseeded.
        """
        return None if self.seed is None else (self.seed + index) % _SEED_MODULUS

    def verify_for_model(self, vocab_size: int, max_model_len: int,
                         num_prompt_tokens: int) -> None:
        """The checks that need the model and the prompt; raises ``ParamValidationError`` naming the field.

        Token ids (``stop_token_ids``, ``logit_bias``'s keys, ``allowed_token_ids``) must be
        in the vocabulary and ``top_k`` at most its size; the
        prompt plus ``max_tokens`` (and plus ``min_tokens``) must fit in
        ``max_model_len``, as vLLM's server checks ``max_tokens``, so no request
        can ask to hold a slot for more than the model's context.
        """
        for name, ids in (("stop_token_ids", self.stop_token_ids),
                          ("logit_bias", self.logit_bias or ()),
                          ("allowed_token_ids", self.allowed_token_ids or ())):
            for t in ids:
                if t >= vocab_size:
                    raise ParamValidationError(f"{name} must be token ids in [0, "
                                               f"{vocab_size}) (the model's vocabulary), got "
                                               f"{t}", name)
        if self.top_k > vocab_size:
            raise ParamValidationError(f"top_k must be at most the vocabulary size "
                                       f"({vocab_size}), or 0 / -1 to disable it, got "
                                       f"{self.top_k}", "top_k")
        room = max_model_len - num_prompt_tokens
        for name in ("max_tokens", "min_tokens"):
            value = getattr(self, name)
            if value is not None and value > room:
                raise ParamValidationError(
                    f"{name} is too large: {value}. This model's context is max_model_len="
                    f"{max_model_len} tokens and the prompt has {num_prompt_tokens}, so at most "
                    f"{room} tokens can be generated; lower {name} or shorten the prompt", name)

    def truncated_prompt(self, token_ids: list[int], max_model_len: int) -> list[int]:
        """The prompt's last ``truncate_prompt_tokens`` tokens (-1: ``max_model_len``), or all
        of them without it; raises ``ParamValidationError`` if it asks for more than the
        model's context."""
        keep = self.truncate_prompt_tokens
        if keep is None:
            return token_ids
        if keep > max_model_len:
            raise ParamValidationError(
                f"truncate_prompt_tokens is {keep}, more than the model's context (max_model_len="
                f"{max_model_len}); keep at most that many, or -1 for exactly that many",
                "truncate_prompt_tokens")
        return token_ids[-(max_model_len if keep == -1 else keep):]

    @property
    def has_penalties(self) -> bool:
        return (self.repetition_penalty != 1.0 or self.presence_penalty != 0.0
                or self.frequency_penalty != 0.0)

    def _validate(self) -> None:
        check_int("n", self.n, lo=1, hi=128)
        check_number("temperature", self.temperature, ">= 0", self.temperature >= 0)
        check_number("top_p", self.top_p, "in (0, 1]", 0 < self.top_p <= 1)
        check_int("top_k", self.top_k, lo=0, note="0 or -1 disables it")
        check_number("min_p", self.min_p, "in [0, 1]", 0 <= self.min_p <= 1)
        check_number("repetition_penalty", self.repetition_penalty, "> 0",
                     self.repetition_penalty > 0)
        check_number("presence_penalty", self.presence_penalty, "in [-2, 2]",
                     -2 <= self.presence_penalty <= 2)
        check_number("frequency_penalty", self.frequency_penalty, "in [-2, 2]",
                     -2 <= self.frequency_penalty <= 2)
        if self.seed is not None:
            check_int("seed", self.seed, lo=SEED_MIN, hi=SEED_MAX,
                      note="a signed or unsigned 64-bit integer")
        if self.max_tokens is not None:
            check_int("max_tokens", self.max_tokens, lo=1)
        check_int("min_tokens", self.min_tokens, lo=0)
        if self.max_tokens is not None and self.min_tokens > self.max_tokens:
            raise ParamValidationError(
                f"min_tokens must be <= max_tokens, got min_tokens={self.min_tokens} "
                f"and max_tokens={self.max_tokens}", "min_tokens")
        if self.logprobs is not None:
            check_int("logprobs", self.logprobs, lo=0, hi=20)
        for s in self.stop:
            if not isinstance(s, str) or not s:
                raise ParamValidationError(f"stop must hold non-empty strings, got {s!r}", "stop")
        for t in self.stop_token_ids:
            check_int("stop_token_ids", t, lo=0)
        if self.allowed_token_ids is not None:
            if not self.allowed_token_ids:
                raise ParamValidationError("allowed_token_ids must name at least one token "
                                           "(leave it out to allow every token)",
                                           "allowed_token_ids")
            for t in self.allowed_token_ids:
                check_int("allowed_token_ids", t, lo=0)
        if self.truncate_prompt_tokens is not None:
            check_int("truncate_prompt_tokens", self.truncate_prompt_tokens, lo=-1,
                      note="-1 keeps the model's max_model_len")
            if self.truncate_prompt_tokens == 0:
                raise ParamValidationError("truncate_prompt_tokens must be >= 1, or -1 for the "
                                           "model's max_model_len, got 0",
                                           "truncate_prompt_tokens")
        for word in self.bad_words or ():
            if not isinstance(word, str) or not word.strip():
                raise ParamValidationError(f"bad_words must hold words (non-blank strings), got "
                                           f"{word!r}", "bad_words")
            check_utf8("bad_words", word)
        for name in ("ignore_eos", "skip_special_tokens", "include_stop_str_in_output"):
            check_bool(name, getattr(self, name))



def _output_kind(value: Any) -> RequestOutputKind:
    kinds = {kind.value: kind for kind in RequestOutputKind}
    if isinstance(value, bool) or not isinstance(value, int) or value not in kinds:
        names = ", ".join(f"{kind.value} ({kind.name})" for kind in RequestOutputKind)
        raise ParamValidationError(f"output_kind must be one of {names}, got {value!r}",
                                   "output_kind")
    return kinds[value]

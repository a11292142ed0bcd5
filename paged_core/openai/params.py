"""OpenAI request -> ``SamplingParams``.

Invariant: fields the client did not send keep ``SamplingParams``' defaults
(OpenAI's defaults agree: temperature 1, top_p 1, n 1); every value error is a
400 whose ``param`` is the request field the client wrote (``top_logprobs``,
``max_completion_tokens``), not the engine's name for it.
"""
from __future__ import annotations

from typing import Any

from paged_core.lora.request import LoRARequest

from paged_core.beam_search.params import BeamSearchParams
from paged_core.sampling_params import SamplingParams

from .beam_params import beam_search_params
from .errors import OpenAIError, bad_request
from .protocol import ChatCompletionRequest, CompletionRequest, SamplingFields
from .structured import structured_outputs_of
from .tool_calls import forced_call_constraint, tool_choice_mode

_PASS_THROUGH = ("n", "temperature", "top_p", "stop", "seed", "presence_penalty",
                 "frequency_penalty", "top_k", "min_p", "repetition_penalty", "min_tokens",
                 "ignore_eos", "stop_token_ids", "skip_special_tokens",
                 "include_stop_str_in_output", "allowed_token_ids", "bad_words",
                 "truncate_prompt_tokens")
MAX_STOP_SEQUENCES = 4  # OpenAI's limit
LOGIT_BIAS_LIMIT = 100.0  # OpenAI's range for a bias is [-100, 100]; vLLM clamps to it


def request_field_names(req: SamplingFields) -> dict[str, str]:
    """Engine field names -> the request fields this client wrote, where they differ (chat)."""
    if not isinstance(req, ChatCompletionRequest):
        return {"beam_width": "n"} if req.use_beam_search else {}
    rename = {"logprobs": "top_logprobs"} if req.logprobs else {}
    if req.use_beam_search:
        rename["beam_width"] = "n"
    if req.max_completion_tokens is not None:
        rename["max_tokens"] = "max_completion_tokens"
    return rename


def engine_refusal(exc: ValueError, req: SamplingFields, prompt_param: str) -> OpenAIError:
    """A 400 for the engine's refusal of a request (checks that need the model or the
    prompt): ``param`` is the sampling field the message names, else ``prompt_param``."""
    return bad_request(exc, rename=request_field_names(req), default_param=prompt_param)


def generate_options(req: SamplingFields, lora: LoRARequest | None = None) -> dict[str, Any]:
    """Keyword arguments of ``engine.generate`` beside the prompt and ``SamplingParams``:
    ``priority``, ``timeout`` and the ``user`` as the tenant (checked by the engine), and
    the ``lora_request`` its ``model`` names."""
    options = {"priority": req.priority, "timeout": req.timeout, "tenant": req.user}
    return options if lora is None else {**options, "lora_request": lora}


def salted_prompts(prompts: list[Any], req: SamplingFields) -> list[Any]:
    """The engine prompts, each carrying the request's ``cache_salt`` if it has one
    (checked by the engine: a 400 naming ``cache_salt``)."""
    if req.cache_salt is None:
        return prompts
    return [{**(p if isinstance(p, dict) else {"prompt": p}), "cache_salt": req.cache_salt}
            for p in prompts]


def _common(req: SamplingFields) -> dict[str, Any]:
    if isinstance(req.stop, list) and len(req.stop) > MAX_STOP_SEQUENCES:
        raise OpenAIError(400, f"stop holds at most {MAX_STOP_SEQUENCES} sequences, got "
                               f"{len(req.stop)}", param="stop")
    values = {name: getattr(req, name) for name in _PASS_THROUGH}
    if req.logit_bias:  # token id strings: SamplingParams reads them and checks the keys
        values["logit_bias"] = {token: _clamped(bias) for token, bias in req.logit_bias.items()}
    values["structured_outputs"] = structured_outputs_of(req)
    return {k: v for k, v in values.items() if v is not None}


def _clamped(bias: float) -> float:
    """A ``logit_bias`` value within OpenAI's [-100, 100] (vLLM clamps too); NaN stays, for
    ``SamplingParams`` to refuse."""
    return min(LOGIT_BIAS_LIMIT, max(-LOGIT_BIAS_LIMIT, bias)) if bias == bias else bias


def _build(values: dict[str, Any], req: SamplingFields) -> SamplingParams:
    try:
        return SamplingParams(**values)
    except ValueError as exc:
        raise bad_request(exc, rename=request_field_names(req)) from None


# Fields beam search cannot honour: it ranks whole continuations by their model
# log-probabilities, under no grammar and no edit of the logits, over the whole prompt.
_NOT_WITH_BEAMS = ("tools", "response_format", "structured_outputs", "guided_json",
                   "guided_regex", "guided_choice", "guided_grammar", "logit_bias",
                   "allowed_token_ids", "bad_words", "truncate_prompt_tokens")


def _refuse_with_beams(req: SamplingFields) -> None:
    """A 400 naming the first of ``_NOT_WITH_BEAMS`` the request sets."""
    for name in _NOT_WITH_BEAMS:
        value = getattr(req, name, None)
        if value not in (None, [], {}) and getattr(value, "type", None) != "text":
            raise OpenAIError(400, f"use_beam_search cannot be combined with {name}; drop one "
                                   f"of them", param=name)


def completion_params(req: CompletionRequest) -> SamplingParams | BeamSearchParams:
    """``SamplingParams`` of a ``/v1/completions`` request (``logprobs`` is the top-k count),
    or ``BeamSearchParams`` with ``use_beam_search``."""
    if req.echo:
        raise OpenAIError(400, "echo is not supported", param="echo")
    if req.suffix:
        raise OpenAIError(400, "suffix is not supported", param="suffix")
    if req.best_of is not None and req.best_of != req.n:
        raise OpenAIError(400, "best_of must equal n (best_of ranking is not supported; "
                               "use_beam_search returns the n best beams)", param="best_of")
    if req.use_beam_search:
        _refuse_with_beams(req)
        return beam_search_params(req, req.max_tokens, request_field_names(req))
    values = _common(req)
    values["max_tokens"] = req.max_tokens
    if req.logprobs is not None:
        values["logprobs"] = req.logprobs
    return _build(values, req)


def chat_params(req: ChatCompletionRequest) -> SamplingParams | BeamSearchParams:
    """``SamplingParams`` of a chat request: ``logprobs`` flag + ``top_logprobs`` count;
    ``tool_choice`` "required" or a named function becomes the output's grammar;
    ``BeamSearchParams`` with ``use_beam_search`` (no tools or response_format then)."""
    if req.use_beam_search:
        _refuse_with_beams(req)
        max_tokens = req.max_completion_tokens if req.max_completion_tokens is not None \
            else req.max_tokens
        return beam_search_params(req, max_tokens, request_field_names(req))
    values = _common(req)
    mode, name = tool_choice_mode(req.tools, req.tool_choice)
    if mode in ("required", "named"):
        if "structured_outputs" in values:
            raise OpenAIError(400, "tool_choice 'required' or a named function constrains the "
                                   "output already; drop response_format / guided_*",
                              param="tool_choice")
        values["structured_outputs"] = forced_call_constraint(req.tools, mode, name,
                                                              req.parallel_tool_calls)
    if req.max_completion_tokens is not None:
        values["max_tokens"] = req.max_completion_tokens
    else:
        values["max_tokens"] = req.max_tokens
    if req.top_logprobs is not None and not req.logprobs:
        raise OpenAIError(400, "top_logprobs requires logprobs to be true", param="top_logprobs")
    if req.logprobs:
        values["logprobs"] = req.top_logprobs or 0
    return _build(values, req)

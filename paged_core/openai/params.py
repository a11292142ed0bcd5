"""OpenAI request -> ``SamplingParams``.

Invariant: fields the client did not send keep ``SamplingParams``' defaults
(OpenAI's defaults agree: temperature 1, top_p 1, n 1); every value error is a
400 whose ``param`` is the request field the client wrote (``top_logprobs``,
``max_completion_tokens``), not the engine's name for it.
"""
from __future__ import annotations

from dataclasses import fields
from typing import Any

from paged_core.sampling_params import SamplingParams

from .errors import OpenAIError, bad_request
from .protocol import ChatCompletionRequest, CompletionRequest, SamplingFields

_PASS_THROUGH = ("n", "temperature", "top_p", "stop", "seed", "presence_penalty",
                 "frequency_penalty", "top_k", "min_p", "repetition_penalty", "min_tokens",
                 "ignore_eos", "stop_token_ids", "skip_special_tokens",
                 "include_stop_str_in_output")
_GENERATE_OPTIONS = ("priority", "timeout")  # arguments of engine.generate, not SamplingParams
_ENGINE_FIELDS = tuple(f.name for f in fields(SamplingParams)) + _GENERATE_OPTIONS
MAX_STOP_SEQUENCES = 4  # OpenAI's limit


def request_field_names(req: SamplingFields) -> dict[str, str]:
    """Engine field names -> the request fields this client wrote, where they differ (chat)."""
    if not isinstance(req, ChatCompletionRequest):
        return {}
    rename = {"logprobs": "top_logprobs"} if req.logprobs else {}
    if req.max_completion_tokens is not None:
        rename["max_tokens"] = "max_completion_tokens"
    return rename


def engine_refusal(exc: ValueError, req: SamplingFields, prompt_param: str) -> OpenAIError:
    """A 400 for the engine's refusal of a request (checks that need the model or the
    prompt): ``param`` is the sampling field the message names, else ``prompt_param``."""
    return bad_request(exc, _ENGINE_FIELDS, rename=request_field_names(req),
                       default_param=prompt_param)


def generate_options(req: SamplingFields) -> dict[str, Any]:
    """Keyword arguments of ``engine.generate`` beside the prompt and ``SamplingParams``:
    ``priority``, ``timeout`` and the ``user`` as the tenant (checked by the engine)."""
    return {"priority": req.priority, "timeout": req.timeout, "tenant": req.user}


def _common(req: SamplingFields) -> dict[str, Any]:
    if req.logit_bias:
        raise OpenAIError(400, "logit_bias is not supported", param="logit_bias")
    if isinstance(req.stop, list) and len(req.stop) > MAX_STOP_SEQUENCES:
        raise OpenAIError(400, f"stop holds at most {MAX_STOP_SEQUENCES} sequences, got "
                               f"{len(req.stop)}", param="stop")
    values = {name: getattr(req, name) for name in _PASS_THROUGH}
    return {k: v for k, v in values.items() if v is not None}


def _build(values: dict[str, Any], req: SamplingFields) -> SamplingParams:
    try:
        return SamplingParams(**values)
    except ValueError as exc:
        raise bad_request(exc, _ENGINE_FIELDS, rename=request_field_names(req)) from None


def completion_params(req: CompletionRequest) -> SamplingParams:
    """``SamplingParams`` of a ``/v1/completions`` request (``logprobs`` is the top-k count)."""
    if req.echo:
        raise OpenAIError(400, "echo is not supported", param="echo")
    if req.suffix:
        raise OpenAIError(400, "suffix is not supported", param="suffix")
    if req.best_of is not None and req.best_of != req.n:
        raise OpenAIError(400, "best_of must equal n (beam search / best_of ranking is not "
                               "supported)", param="best_of")
    values = _common(req)
    values["max_tokens"] = req.max_tokens
    if req.logprobs is not None:
        values["logprobs"] = req.logprobs
    return _build(values, req)


def chat_params(req: ChatCompletionRequest) -> SamplingParams:
    """``SamplingParams`` of a chat request: ``logprobs`` flag + ``top_logprobs`` count."""
    if req.response_format is not None and req.response_format.type != "text":
        raise OpenAIError(400, f"response_format {req.response_format.type!r} is not supported",
                          param="response_format")
    if req.tools:
        raise OpenAIError(400, "tools are not supported", param="tools")
    values = _common(req)
    if req.max_completion_tokens is not None:
        values["max_tokens"] = req.max_completion_tokens
    else:
        values["max_tokens"] = req.max_tokens
    if req.top_logprobs is not None and not req.logprobs:
        raise OpenAIError(400, "top_logprobs requires logprobs to be true", param="top_logprobs")
    if req.logprobs:
        values["logprobs"] = req.top_logprobs or 0
    return _build(values, req)

"""The request flow shared by ``/v1/completions`` and ``/v1/chat/completions``.

An endpoint only says how to format a choice (``Formatter``); this module owns
the flow: start every prompt (refusals -> 400 before any byte is sent), then
either collect the final outputs or stream Server-Sent Events
(``data: {json}\\n\\n`` ... ``data: [DONE]\\n\\n``), aborting on disconnect.
Choice ``index`` is ``prompt_index * n + completion.index``.
"""
from __future__ import annotations

import json
import logging
import time
from dataclasses import dataclass, field
from typing import Any, AsyncIterator

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from paged_core.lora.request import LoRARequest
from paged_core.serving.engine_client import EngineClient
from paged_core.outputs import CompletionOutput, RequestOutput
from paged_core.sampling_params import SamplingParams

from . import generation
from .disconnect import ClientClosedRequest, ClientDisconnected, SSEResponse, cancel_on_disconnect
from .errors import ENGINE_ERRORS, OpenAIError, engine_error, error_body
from .metrics import ServingMetrics

logger = logging.getLogger(__name__)


class Formatter:
    """How one endpoint renders choices; subclasses set the object names."""

    object_name = ""
    chunk_object_name = ""
    id_prefix = ""

    def first_chunks(self, num_choices: int) -> list[dict[str, Any]]:
        """Choices to send before any token (chat sends the assistant role)."""
        return []

    def delta_choice(self, index: int, comp: CompletionOutput, offset: int) -> dict[str, Any]:
        raise NotImplementedError

    def final_choice(self, index: int, comp: CompletionOutput) -> dict[str, Any]:
        raise NotImplementedError


@dataclass
class Job:
    """One validated request, ready to run."""

    engine: EngineClient
    metrics: ServingMetrics
    formatter: Formatter
    prompts: list[Any]
    params: SamplingParams
    refusal: generation.Refusal  # the engine's ValueError -> a 400 naming the request field
    include_usage: bool = False
    options: dict[str, Any] = field(default_factory=dict)  # engine.generate keywords
    lora: LoRARequest | None = None  # the adapter the request's ``model`` named
    response_id: str = field(default="")
    created: int = field(default_factory=lambda: int(time.time()))

    def __post_init__(self) -> None:
        self.response_id = generation.new_id(self.formatter.id_prefix)

    @property
    def model_name(self) -> str:
        """What the reply calls the model: the adapter's name, or the base model's."""
        return self.engine.model_name if self.lora is None else self.lora.lora_name

    def envelope(self, object_name: str, choices: list[dict[str, Any]]) -> dict[str, Any]:
        return {"id": self.response_id, "object": object_name, "created": self.created,
                "model": self.model_name, "choices": choices}


def _usage(prompt_tokens: int, completion_tokens: int) -> dict[str, int]:
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens}


def _usage_of(finals: dict[int, RequestOutput]) -> dict[str, int]:
    prompt = sum(len(o.prompt_token_ids) for o in finals.values())
    completion = sum(len(c.token_ids) for o in finals.values() for c in o.outputs)
    return _usage(prompt, completion)


async def run(request: Request, job: Job, stream: bool) -> Response:
    """Run ``job`` for the HTTP ``request``: JSON response or SSE stream."""
    try:
        streams = await cancel_on_disconnect(
            request.receive,
            lambda: generation.start_all(job.engine, job.prompts, job.params, job.metrics,
                                         job.refusal, job.options))
    except ClientDisconnected:
        return ClientClosedRequest()
    if stream:
        return SSEResponse(_events(job, streams))
    try:
        finals = await cancel_on_disconnect(request.receive, lambda: _collect(streams))
    except ClientDisconnected:
        return ClientClosedRequest()
    n = job.params.n
    choices = [job.formatter.final_choice(i * n + c.index, c)
               for i, out in sorted(finals.items()) for c in out.outputs]
    body = job.envelope(job.formatter.object_name, choices)
    body["usage"] = _usage_of(finals)
    job.metrics.count_model_usage(job.model_name, body["usage"]["completion_tokens"])
    return JSONResponse(body)


async def _collect(streams: list[AsyncIterator[RequestOutput]]) -> dict[int, RequestOutput]:
    finals: dict[int, RequestOutput] = {}
    async for i, out in generation.merge(streams):
        finals[i] = out
    return finals


def _sse(data: dict[str, Any], ensure_ascii: bool = False) -> str:
    """One event; errors are ASCII-escaped (they may quote client text with lone surrogates)."""
    return f"data: {json.dumps(data, ensure_ascii=ensure_ascii)}\n\n"


async def _events(job: Job, streams: list[AsyncIterator[RequestOutput]]) -> AsyncIterator[str]:
    n = job.params.n
    offsets: dict[int, int] = {}
    reported_finish: set[int] = set()
    finals: dict[int, RequestOutput] = {}
    try:
        first = job.formatter.first_chunks(len(job.prompts) * n)
        for choice in first:
            yield _sse(job.envelope(job.formatter.chunk_object_name, [choice]))
        async for i, out in generation.merge(streams):
            finals[i] = out
            for comp in out.outputs:
                index = i * n + comp.index
                finishing = comp.finish_reason is not None and index not in reported_finish
                if not (comp.delta_text or comp.delta_token_ids or finishing):
                    continue
                if finishing:
                    reported_finish.add(index)
                choice = job.formatter.delta_choice(index, comp, offsets.get(index, 0))
                offsets[index] = offsets.get(index, 0) + len(comp.delta_text)
                yield _sse(job.envelope(job.formatter.chunk_object_name, [choice]))
        usage = _usage_of(finals)
        job.metrics.count_model_usage(job.model_name, usage["completion_tokens"])
        if job.include_usage:
            chunk = job.envelope(job.formatter.chunk_object_name, [])
            chunk["usage"] = usage
            yield _sse(chunk)
    except OpenAIError as exc:
        yield _sse(exc.body(), ensure_ascii=True)
    except ENGINE_ERRORS as exc:  # one request failed (500) or the engine stopped (503)
        yield _sse(engine_error(exc).body(), ensure_ascii=True)
    except Exception as exc:  # the status is already 200: report in-band, keep the server up
        logger.exception("stream %s failed", job.response_id)
        yield _sse(error_body(500, f"generation failed: {exc}"), ensure_ascii=True)
    yield "data: [DONE]\n\n"

"""``POST /v1/chat/completions``: messages -> chat template -> ``chat.completion`` objects."""
from __future__ import annotations

import asyncio
from functools import partial
from typing import Any

from paged_core.engine_client import EngineClient
from paged_core.outputs import CompletionOutput

from .errors import OpenAIError
from .logprobs import chat_logprobs
from .metrics import ServingMetrics
from .params import chat_params, engine_refusal, generate_options
from .protocol import ChatCompletionRequest
from .serving import Formatter, Job


class ChatFormatter(Formatter):
    object_name = "chat.completion"
    chunk_object_name = "chat.completion.chunk"
    id_prefix = "chatcmpl"

    def __init__(self, logprobs: bool, top_logprobs: int | None) -> None:
        self.want_logprobs = logprobs
        self.k = top_logprobs or 0

    def first_chunks(self, num_choices: int) -> list[dict[str, Any]]:
        return [{"index": i, "delta": {"role": "assistant", "content": ""}, "logprobs": None,
                 "finish_reason": None} for i in range(num_choices)]

    def delta_choice(self, index: int, comp: CompletionOutput, offset: int) -> dict[str, Any]:
        logprobs = (chat_logprobs(comp.delta_token_ids, comp.delta_logprobs, self.k)
                    if self.want_logprobs else None)
        delta = {"content": comp.delta_text} if comp.delta_text else {}
        return {"index": index, "delta": delta, "logprobs": logprobs,
                "finish_reason": comp.finish_reason}

    def final_choice(self, index: int, comp: CompletionOutput) -> dict[str, Any]:
        logprobs = (chat_logprobs(comp.token_ids, comp.logprobs, self.k)
                    if self.want_logprobs else None)
        return {"index": index, "message": {"role": "assistant", "content": comp.text},
                "logprobs": logprobs, "finish_reason": comp.finish_reason}


async def chat_job(engine: EngineClient, metrics: ServingMetrics,
                   req: ChatCompletionRequest) -> Job:
    """The job of a chat request; the template is rendered and tokenized in a worker thread."""
    params = chat_params(req)
    try:
        messages = [m.as_template_dict() for m in req.messages]
        prompt_ids = await asyncio.to_thread(engine.apply_chat_template, messages)
    except ValueError as exc:
        raise OpenAIError(400, str(exc), param="messages") from None
    include_usage = bool(req.stream_options and req.stream_options.include_usage)
    return Job(engine=engine, metrics=metrics,
               formatter=ChatFormatter(req.logprobs, req.top_logprobs),
               prompts=[{"prompt_token_ids": prompt_ids}], params=params,
               refusal=partial(engine_refusal, req=req, prompt_param="messages"),
               include_usage=include_usage, options=generate_options(req))

"""``POST /v1/chat/completions``: messages -> chat template -> ``chat.completion`` objects.

With tools (``tool_choice`` not "none") every choice goes through a
``ToolCallMode``: replies carry ``tool_calls`` and stream OpenAI's tool-call
deltas (see ``tool_calls``).
"""
from __future__ import annotations

import asyncio
from functools import partial
from typing import Any

from paged_core.lora.request import LoRARequest
from paged_core.serving.engine_client import EngineClient
from paged_core.outputs import CompletionOutput

from .errors import OpenAIError
from .logprobs import chat_logprobs
from .metrics import ServingMetrics
from .params import chat_params, engine_refusal, generate_options, salted_prompts
from .protocol import ChatCompletionRequest
from .serving import Formatter, Job
from .tool_calls import ToolCallMode, ToolCallStream, tool_call_mode, tool_choice_mode
from .tool_prompt import template_inputs


class ChatFormatter(Formatter):
    object_name = "chat.completion"
    chunk_object_name = "chat.completion.chunk"
    id_prefix = "chatcmpl"

    def __init__(self, logprobs: bool, top_logprobs: int | None,
                 tools: ToolCallMode | None = None) -> None:
        self.want_logprobs = logprobs
        self.k = top_logprobs or 0
        self.tools = tools
        self._streams: dict[int, ToolCallStream] = {}

    def first_chunks(self, num_choices: int) -> list[dict[str, Any]]:
        return [{"index": i, "delta": {"role": "assistant", "content": ""}, "logprobs": None,
                 "finish_reason": None} for i in range(num_choices)]

    def delta_choice(self, index: int, comp: CompletionOutput, offset: int) -> dict[str, Any]:
        logprobs = (chat_logprobs(comp.delta_token_ids, comp.delta_logprobs, self.k)
                    if self.want_logprobs else None)
        delta = {"content": comp.delta_text} if comp.delta_text else {}
        finish_reason = comp.finish_reason
        if self.tools is not None:
            stream = self._streams.setdefault(index, self.tools.stream())
            delta, finish_reason = stream.delta(comp)
        return {"index": index, "delta": delta, "logprobs": logprobs,
                "finish_reason": finish_reason}

    def final_choice(self, index: int, comp: CompletionOutput) -> dict[str, Any]:
        logprobs = (chat_logprobs(comp.token_ids, comp.logprobs, self.k)
                    if self.want_logprobs else None)
        message, finish_reason = {"role": "assistant", "content": comp.text}, comp.finish_reason
        if self.tools is not None:
            message, finish_reason = self.tools.message(comp)
        return {"index": index, "message": message, "logprobs": logprobs,
                "finish_reason": finish_reason}


async def chat_job(engine: EngineClient, metrics: ServingMetrics, req: ChatCompletionRequest,
                   lora: LoRARequest | None = None) -> Job:
    """The job of a chat request (under ``lora``, when its ``model`` names an adapter); the
    template is rendered and tokenized in a worker thread."""
    params = chat_params(req)
    mode, name = tool_choice_mode(req.tools, req.tool_choice)
    template = getattr(engine.tokenizer, "chat_template", None)
    tools = tool_call_mode(mode, name, template, engine.tool_call_parser)
    try:
        messages, template_tools = template_inputs(
            [m.as_template_dict() for m in req.messages], req.tools if tools else None, template)
        prompt_ids = await asyncio.to_thread(engine.apply_chat_template, messages,
                                             template_tools)
    except ValueError as exc:
        raise OpenAIError(400, str(exc), param="messages") from None
    include_usage = bool(req.stream_options and req.stream_options.include_usage)
    return Job(engine=engine, metrics=metrics,
               formatter=ChatFormatter(req.logprobs, req.top_logprobs, tools),
               prompts=salted_prompts([{"prompt_token_ids": prompt_ids}], req), params=params,
               refusal=partial(engine_refusal, req=req, prompt_param="messages"),
               include_usage=include_usage, options=generate_options(req, lora), lora=lora)

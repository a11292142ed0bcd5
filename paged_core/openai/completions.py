"""``POST /v1/completions``: prompt(s) in, ``text_completion`` objects out."""
from __future__ import annotations

from functools import partial
from typing import Any

from paged_core.lora.request import LoRARequest
from paged_core.serving.engine_client import EngineClient
from paged_core.outputs import CompletionOutput

from .errors import OpenAIError
from .logprobs import completion_logprobs
from .metrics import ServingMetrics
from .params import completion_params, engine_refusal, generate_options, salted_prompts
from .protocol import CompletionRequest
from .serving import Formatter, Job


class CompletionFormatter(Formatter):
    object_name = "text_completion"
    chunk_object_name = "text_completion"
    id_prefix = "cmpl"

    def __init__(self, num_logprobs: int | None) -> None:
        self.k = num_logprobs or 0
        self.want_logprobs = num_logprobs is not None

    def delta_choice(self, index: int, comp: CompletionOutput, offset: int) -> dict[str, Any]:
        logprobs = (completion_logprobs(comp.delta_token_ids, comp.delta_logprobs, self.k, offset)
                    if self.want_logprobs else None)
        return {"index": index, "text": comp.delta_text, "logprobs": logprobs,
                "finish_reason": comp.finish_reason}

    def final_choice(self, index: int, comp: CompletionOutput) -> dict[str, Any]:
        logprobs = (completion_logprobs(comp.token_ids, comp.logprobs, self.k, 0)
                    if self.want_logprobs else None)
        return {"index": index, "text": comp.text, "logprobs": logprobs,
                "finish_reason": comp.finish_reason}


def _prompts(prompt: Any) -> list[Any]:
    """Normalize ``prompt`` to a list of engine prompts (text or token-id lists)."""
    if isinstance(prompt, str):
        return [prompt]
    if not prompt:
        raise OpenAIError(400, "prompt must not be empty", param="prompt")
    if all(isinstance(p, int) for p in prompt):
        return [{"prompt_token_ids": list(prompt)}]
    return [p if isinstance(p, str) else {"prompt_token_ids": list(p)} for p in prompt]


def completion_job(engine: EngineClient, metrics: ServingMetrics, req: CompletionRequest,
                   lora: LoRARequest | None = None) -> Job:
    """The job of a completion request (under ``lora``, when its ``model`` names an adapter)."""
    params = completion_params(req)
    include_usage = bool(req.stream_options and req.stream_options.include_usage)
    return Job(engine=engine, metrics=metrics, formatter=CompletionFormatter(req.logprobs),
               prompts=salted_prompts(_prompts(req.prompt), req), params=params,
               refusal=partial(engine_refusal, req=req, prompt_param="prompt"),
               include_usage=include_usage, options=generate_options(req, lora), lora=lora)

"""vLLM's render routes: the tokens a request would run with, without running it.

``POST /v1/completions/render`` answers a list (one per prompt) and ``POST
/v1/chat/completions/render`` one of vLLM's ``GenerateRequest`` objects: ``request_id``,
``token_ids`` (exactly what the engine would be given: the same tokenizer, chat template and
tool prompt as the generating routes), ``sampling_params``, ``model``, ``stream``. The
request is checked as for generation (a 400 naming the field; 404 for an unknown model);
beam search is refused, as in vLLM.

Routers that place a request by its tokens ask a replica for them here: vllm-router's
``kv_aware`` policy matches them against the blocks each replica announced in its KV events.
"""
from __future__ import annotations

import asyncio
from dataclasses import asdict
from typing import Any

from fastapi import APIRouter
from fastapi.encoders import jsonable_encoder

from paged_core.exceptions import ParamValidationError
from paged_core.frontend.prompts import tokenize_prompt

from .chat import chat_job
from .completions import completion_job
from .errors import OpenAIError
from .protocol import ChatCompletionRequest, CompletionRequest
from .serving import Job


def render_router(holder) -> APIRouter:
    """The render routes over ``holder`` (the app's ``EngineHolder``)."""
    router = APIRouter()

    @router.post("/v1/completions/render")
    async def render_completion(body: CompletionRequest) -> list[dict[str, Any]]:
        _refuse_beams(body.use_beam_search)
        engine, lora = holder.check_model(body.model)
        return await _rendered(completion_job(engine, holder.metrics, body, lora), body)

    @router.post("/v1/chat/completions/render")
    async def render_chat(body: ChatCompletionRequest) -> dict[str, Any]:
        _refuse_beams(body.use_beam_search)
        engine, lora = holder.check_model(body.model)
        (rendered,) = await _rendered(await chat_job(engine, holder.metrics, body, lora), body)
        return rendered

    return router


def _refuse_beams(use_beam_search: bool) -> None:
    if use_beam_search:
        raise OpenAIError(400, "beam search is not supported by the render endpoints",
                          param="use_beam_search")


async def _rendered(job: Job, body: CompletionRequest | ChatCompletionRequest
                    ) -> list[dict[str, Any]]:
    """One ``GenerateRequest`` per prompt of ``job`` (text tokenized in a worker thread)."""
    tokenizer = job.engine.tokenizer
    try:
        token_ids = await asyncio.to_thread(
            lambda: [tokenize_prompt(p, tokenizer, None)[1] for p in job.prompts])
    except ValueError as exc:
        raise OpenAIError(400, str(exc), param="prompt") from None
    try:  # the tokens the engine keeps (truncate_prompt_tokens), which it caches and routers match
        token_ids = [job.params.truncated_prompt(ids, job.engine.max_model_len)
                     for ids in token_ids]
    except ParamValidationError as exc:
        raise OpenAIError(400, str(exc), param=exc.param) from None
    params = jsonable_encoder(asdict(job.params))
    single = len(token_ids) == 1
    return [{"request_id": job.response_id if single else f"{job.response_id}-{i}",
             "token_ids": ids, "sampling_params": params, "model": job.model_name,
             "stream": bool(body.stream)} for i, ids in enumerate(token_ids)]

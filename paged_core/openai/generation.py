"""Driving engine requests for the OpenAI routes.

Invariants:
- a request is *started* (its first output awaited) before the HTTP response
  begins, so a prompt the engine refuses (too long, empty) becomes a 400, not a
  broken 200 stream;
- whatever ends the consumer (finish, error, cancellation, ``aclose()``), every
  unfinished engine request is aborted, under a shielded scope so that a
  cancelled task still reaches ``engine.abort``.
"""
from __future__ import annotations

import asyncio
import uuid
from typing import Any, AsyncIterator, Callable

import anyio

from paged_core.serving.engine_client import EngineClient
from paged_core.outputs import RequestOutput
from paged_core.sampling_params import SamplingParams

from .errors import ENGINE_ERRORS, OpenAIError, engine_error
from .metrics import LatencyTracker, ServingMetrics

_DONE = object()


def new_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex}"


async def _run(engine: EngineClient, first: RequestOutput, gen: AsyncIterator[RequestOutput],
               request_id: str, tracker: LatencyTracker) -> AsyncIterator[RequestOutput]:
    out = first
    try:
        while True:
            tracker.on_tokens(sum(len(c.delta_token_ids) for c in out.outputs))
            yield out
            if out.finished:
                return
            try:
                out = await gen.__anext__()
            except StopAsyncIteration:
                return
    finally:
        with anyio.CancelScope(shield=True):
            await gen.aclose()  # type: ignore[attr-defined]
            if not out.finished:
                await engine.abort(request_id)


Refusal = Callable[[ValueError], OpenAIError]


async def start(engine: EngineClient, prompt: Any, params: SamplingParams,
                metrics: ServingMetrics, refusal: Refusal, options: dict[str, Any]
                ) -> AsyncIterator[RequestOutput]:
    """Submit one prompt and wait for its first output; engine refusals become ``refusal(exc)``.

    ``options`` are further keywords of ``engine.generate`` (priority, timeout, tenant).

    Returns an async iterator over the request's outputs (the first included)
    that aborts the request if closed early.
    """
    request_id = new_id("req")
    tracker = metrics.tracker()  # TTFT counts from here: queueing and prefill included
    gen = engine.generate(prompt, params, request_id=request_id, **options)
    try:
        first = await gen.__anext__()
    except ValueError as exc:
        raise refusal(exc) from None
    except ENGINE_ERRORS as exc:  # failed at once (500) or the engine is not running (503)
        raise engine_error(exc) from None
    except StopAsyncIteration:
        raise OpenAIError(500, "the engine ended the request without output") from None
    except BaseException:
        with anyio.CancelScope(shield=True):
            await gen.aclose()
            await engine.abort(request_id)
        raise
    return _run(engine, first, gen, request_id, tracker)


async def start_all(engine: EngineClient, prompts: list[Any], params: SamplingParams,
                    metrics: ServingMetrics, refusal: Refusal, options: dict[str, Any]
                    ) -> list[AsyncIterator[RequestOutput]]:
    """``start`` every prompt concurrently; if any is refused, abort the others and raise."""
    tasks = [asyncio.ensure_future(start(engine, p, params, metrics, refusal, options))
             for p in prompts]
    try:
        await asyncio.wait(tasks)
    except BaseException:
        for t in tasks:
            t.cancel()
        with anyio.CancelScope(shield=True):
            await asyncio.gather(*tasks, return_exceptions=True)
            await _close_started(tasks)
        raise
    failures = [t.exception() for t in tasks if t.exception() is not None]
    if failures:
        with anyio.CancelScope(shield=True):
            await _close_started(tasks)
        raise failures[0]
    return [t.result() for t in tasks]


async def _close_started(tasks: list[asyncio.Future]) -> None:
    for t in tasks:
        if t.done() and not t.cancelled() and t.exception() is None:
            await t.result().aclose()


async def merge(streams: list[AsyncIterator[RequestOutput]]
                ) -> AsyncIterator[tuple[int, RequestOutput]]:
    """Interleave several requests' outputs as ``(prompt_index, output)``, as they come."""
    if len(streams) == 1:
        try:
            async for out in streams[0]:
                yield 0, out
        finally:
            with anyio.CancelScope(shield=True):
                await streams[0].aclose()  # type: ignore[attr-defined]
        return
    queue: asyncio.Queue = asyncio.Queue()

    async def pump(i: int, stream: AsyncIterator[RequestOutput]) -> None:
        try:
            async for out in stream:
                await queue.put((i, out))
            await queue.put((i, _DONE))
        except Exception as exc:  # handed to the consumer, which re-raises it
            await queue.put((i, exc))

    tasks = [asyncio.ensure_future(pump(i, s)) for i, s in enumerate(streams)]
    try:
        remaining = len(tasks)
        while remaining:
            i, item = await queue.get()
            if item is _DONE:
                remaining -= 1
            elif isinstance(item, Exception):
                raise item
            else:
                yield i, item
    finally:
        with anyio.CancelScope(shield=True):
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            for s in streams:
                await s.aclose()  # type: ignore[attr-defined]

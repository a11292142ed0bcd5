"""The OpenAI-compatible HTTP surface, as routes installable on any FastAPI app.

``build_openai_app(engine)`` gives a standalone app; adapters whose framework
owns the FastAPI app (LitServe) call ``install_openai_routes(app, holder)``.
The engine may be attached later (``holder.engine = ...``) when the framework
builds it at startup; until then the OpenAI routes answer 503 and ``/health``
says not ready.

Routes: ``GET /v1/models``, ``POST /v1/completions``, ``POST
/v1/chat/completions``, ``GET /health`` (optional), ``GET /metrics``; the request's
``model`` is the base model or one of its LoRA adapters by name; ``POST
/v1/load_lora_adapter`` and ``/v1/unload_lora_adapter`` answer when the engine allows
runtime LoRA updating (404 otherwise); ``POST /v1/completions/render`` and
``/v1/chat/completions/render`` give the tokens a request would run with.
"""
from __future__ import annotations

import time
from typing import Any

from fastapi import APIRouter, FastAPI, Request
from starlette.responses import JSONResponse, Response

from paged_core.lora.request import LoRARequest
from paged_core.serving.engine_client import EngineClient

from . import serving
from .chat import chat_job
from .completions import completion_job
from .errors import OpenAIError, install_error_handlers
from .lora_routes import lora_router
from .render_routes import render_router
from .metrics import ServingMetrics
from .protocol import ChatCompletionRequest, CompletionRequest


class EngineHolder:
    """The engine behind the routes (``None`` until built) and its metrics."""

    def __init__(self, engine: EngineClient | None = None) -> None:
        self.engine = engine
        self.created = int(time.time())
        self.metrics = ServingMetrics(self._stats)

    def _stats(self) -> dict[str, Any] | None:
        return None if self.engine is None else self.engine.stats()

    @property
    def ready(self) -> bool:
        """True once the engine is built and its step loop is alive."""
        return self.engine is not None and self.engine.is_running

    def require(self) -> EngineClient:
        if self.engine is None:
            raise OpenAIError(503, "the engine is still loading; retry shortly")
        return self.engine

    def check_model(self, model: str | None) -> tuple[EngineClient, LoRARequest | None]:
        """The engine and the LoRA adapter ``model`` names (``None``: the base model, also
        when ``model`` is omitted); a 404 for any other name."""
        engine = self.require()
        if model is None or model == engine.model_name:
            return engine, None
        lora = next((r for r in engine.lora_requests if r.lora_name == model), None)
        if lora is None:
            served = ", ".join(f"`{name}`" for name in self.model_names(engine))
            raise OpenAIError(404, f"The model `{model}` does not exist; this server serves "
                                   f"{served}", param="model", code="model_not_found")
        return engine, lora

    @staticmethod
    def model_names(engine: EngineClient) -> list[str]:
        return [engine.model_name] + [r.lora_name for r in engine.lora_requests]


def openai_router(holder: EngineHolder, health_path: str | None = "/health",
                  metrics_path: str = "/metrics") -> APIRouter:
    """Routes over ``holder``; error shapes need ``install_error_handlers`` on the app."""
    router = APIRouter()

    @router.get("/v1/models")
    async def list_models() -> dict[str, Any]:
        """The base model, then each LoRA adapter (vLLM's cards: ``root`` is the adapter's
        path, ``parent`` the base model)."""
        engine = holder.require()
        card = {"id": engine.model_name, "object": "model", "created": holder.created,
                "owned_by": "paged-core", "root": engine.model_name, "parent": None,
                "max_model_len": engine.max_model_len}
        cards = [card] + [{**card, "id": r.lora_name, "root": r.lora_path,
                           "parent": engine.model_name} for r in engine.lora_requests]
        return {"object": "list", "data": cards}

    @router.post("/v1/completions")
    async def completions(body: CompletionRequest, request: Request) -> Response:
        engine, lora = holder.check_model(body.model)
        job = completion_job(engine, holder.metrics, body, lora)
        return await serving.run(request, job, stream=body.stream)

    @router.post("/v1/chat/completions")
    async def chat_completions(body: ChatCompletionRequest, request: Request) -> Response:
        engine, lora = holder.check_model(body.model)
        job = await chat_job(engine, holder.metrics, body, lora)
        return await serving.run(request, job, stream=body.stream)

    @router.get(metrics_path)
    async def metrics() -> Response:
        return Response(holder.metrics.render(), media_type="text/plain; version=0.0.4")

    if health_path is not None:
        @router.get(health_path)
        async def health() -> Response:
            if not holder.ready:
                status = "loading" if holder.engine is None else "dead"
                return JSONResponse({"status": status}, status_code=503)
            return JSONResponse({"status": "ok", "model": holder.engine.model_name})

    return router


def install_openai_routes(app: FastAPI, holder: EngineHolder, health_path: str | None = "/health",
                          metrics_path: str = "/metrics") -> None:
    """Add the OpenAI routes (with vLLM's LoRA loading routes, ``lora_routes``, and its
    render routes, ``render_routes``) and OpenAI-shaped error handlers to ``app``."""
    install_error_handlers(app)
    app.include_router(openai_router(holder, health_path, metrics_path))
    app.include_router(lora_router(holder))
    app.include_router(render_router(holder))


def build_openai_app(engine: EngineClient | None = None, *, health_path: str | None = "/health",
                     metrics_path: str = "/metrics") -> FastAPI:
    """A standalone FastAPI app serving ``engine``; ``app.state.holder`` holds it."""
    app = FastAPI(title="paged-core OpenAI-compatible API")
    holder = EngineHolder(engine)
    app.state.holder = holder
    install_openai_routes(app, holder, health_path, metrics_path)
    return app

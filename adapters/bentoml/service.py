"""BentoML service: the shared OpenAI routes mounted on a new-style ``@bentoml.service``.

Start it (engine settings from ``PAGED_CORE_*`` variables)::

    bentoml serve paged_core.adapters.bentoml.service:PagedLLM --host 127.0.0.1 --port 3000

Invariants:
- one worker process, one engine: continuous batching serves every request of
  the service concurrently (BentoML's own batching is not used);
- the engine is built when BentoML creates the service instance (server
  startup), so ``/readyz`` (``__is_ready__``) is 200 only once it is loaded and
  its step loop alive; requests before then get 503;
- SIGTERM / SIGINT (circus stopping the worker) drain the engine
  (``drain_on_signals``): readiness false, new requests 503, open ones finish
  within ``drain_timeout`` or end with an error event;
- on shutdown (``@bentoml.on_shutdown``) the engine is detached first, then shut
  down, so no request reaches a stopping engine.

BentoML serves ``/metrics`` itself; its ``__metrics__`` hook appends the engine's
Prometheus metrics there (one scrape target), and ``/engine/metrics`` serves the
engine's alone.
"""
from __future__ import annotations

import logging

import bentoml

from paged_core import AsyncEngine, EngineConfig
from paged_core.openai import build_openai_app

from .._drain import drain_on_signals

logger = logging.getLogger(__name__)

ENGINE_METRICS_PATH = "/engine/metrics"
openai_app = build_openai_app(health_path="/health", metrics_path=ENGINE_METRICS_PATH)


@bentoml.asgi_app(openai_app, path="/")
@bentoml.service(name="paged_llm", workers=1, traffic={"timeout": 3600})
class PagedLLM:
    """Hosts one ``AsyncEngine`` built from ``EngineConfig.from_env()``."""

    def __init__(self) -> None:
        config = EngineConfig.from_env()
        logger.info("loading %s (dtype=%s)", config.model_name, config.dtype)
        self.engine = AsyncEngine(config)
        openai_app.state.holder.engine = self.engine
        drain_on_signals(self.engine, config.drain_timeout)  # built inside uvicorn's startup

    def __is_ready__(self) -> bool:
        return openai_app.state.holder.ready

    def __metrics__(self, content: str) -> str:
        """BentoML's ``/metrics`` text, followed by the engine's metrics."""
        return content + openai_app.state.holder.metrics.render().decode()

    @bentoml.on_shutdown
    async def shutdown_engine(self) -> None:
        openai_app.state.holder.engine = None
        await self.engine.shutdown()
        logger.info("engine shut down")

"""LitServe adapter: the shared OpenAI routes on ``LitServer``'s FastAPI app.

Start it with ``python -m paged_core.adapters.litserve --host 127.0.0.1 --port 8000``
(engine settings from ``PAGED_CORE_*`` variables), or ``run(host, port, config)``.

Why the routes are mounted rather than served by ``LitAPI.predict``: LitServe
0.2.19 passes requests to its inference worker through queues, answers HTTP 200
before the worker has looked at a streaming request, and never tells the
worker that a client left (Lightning-AI/LitServe#165, closed as won't-fix).
That would leave disconnected requests holding KV blocks and turn bad input
into broken 200 streams. So, invariants:

- exactly one API-server process (``num_api_servers=1``) builds the engine in
  its ASGI lifespan (after LitServe forks it; never in the parent) and shuts it
  down on exit: one engine whose continuous batching interleaves every
  request, streaming or not, from that process's event loop;
- SIGTERM / SIGINT drain the engine (``drain_on_signals``): readiness false,
  new requests 503, open ones finish within ``drain_timeout`` (LitServe's
  grace period, 30 s by default, is raised to outlast it) or end with an error
  event; then uvicorn exits;
- LitServe still owns the processes, the uvicorn server, ``/health`` (ready only
  when its worker is up *and* the engine is loaded, via ``LitAPI.health``) and
  ``/info``; the LitAPI itself only answers the ``/litserve/ping`` probe, so its
  worker stays light.
"""
from __future__ import annotations

import asyncio
import logging
import os
import signal
from contextlib import asynccontextmanager
from typing import Any, AsyncIterator

import litserve as ls
from fastapi import FastAPI

from paged_core.config import EngineConfig
from paged_core.openai import EngineHolder, install_openai_routes

from .._drain import drain_on_signals

logger = logging.getLogger(__name__)

PROBE_PATH = "/litserve/ping"


class EngineGateAPI(ls.LitAPI):
    """LitServe's required LitAPI: a ping probe whose ``health()`` gates on the engine."""

    def __init__(self, holder: EngineHolder) -> None:
        super().__init__(api_path=PROBE_PATH)
        self._holder = holder

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_holder"] = None  # the worker process never sees the engine
        return state

    def setup(self, device: str) -> None:
        self.device_name = device

    def decode_request(self, request):  # unannotated: LitServe passes the JSON body
        return request

    def predict(self, x: Any) -> dict[str, Any]:
        return {"pong": True, "device": self.device_name}

    def encode_response(self, output: dict[str, Any]) -> dict[str, Any]:
        return output

    def health(self) -> bool:
        return self._holder is not None and self._holder.ready


def _engine_lifespan(app: FastAPI, holder: EngineHolder, config: EngineConfig) -> None:
    """Wrap LitServe's lifespan so the engine lives exactly as long as the API server."""
    inner = app.router.lifespan_context

    @asynccontextmanager
    async def lifespan(a: FastAPI) -> AsyncIterator[None]:
        async with inner(a):
            from paged_core import AsyncEngine

            logger.info("loading %s (dtype=%s)", config.model_name, config.dtype)
            engine = await asyncio.to_thread(AsyncEngine, config)
            holder.engine = engine
            drain_on_signals(engine, config.drain_timeout)  # uvicorn's handlers are set by now
            try:
                yield
            finally:
                holder.engine = None
                await engine.shutdown()
                logger.info("engine shut down")

    app.router.lifespan_context = lifespan


_SHUTDOWN_MARGIN_S = 10  # the engine's shutdown after the drain, and uvicorn's own


def build_server(config: EngineConfig) -> ls.LitServer:
    """A ``LitServer`` serving ``config``'s engine through the OpenAI routes."""
    holder = EngineHolder()
    server = ls.LitServer(EngineGateAPI(holder), accelerator="cpu", workers_per_device=1,
                          timeout=False)
    install_openai_routes(server.app, holder, health_path=None)
    _engine_lifespan(server.app, holder, config)
    # LitServe kills its API server after this many seconds of shutdown (30 by default):
    # never before a drain of ``drain_timeout`` could end
    server.uvicorn_graceful_timeout = max(server.uvicorn_graceful_timeout,
                                          config.drain_timeout + _SHUTDOWN_MARGIN_S)
    return server


def _raise_keyboard_interrupt(signum: int, _frame: object) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def run(host: str = "127.0.0.1", port: int = 8000, config: EngineConfig | None = None,
        log_level: str = "info") -> None:
    """Serve until Ctrl-C / SIGTERM (LitServe stops its processes, the lifespan the engine).

    SIGINT is (re)armed even if our parent ignored it (background shells do), and
    SIGTERM is treated like Ctrl-C, so either one reaches LitServe's graceful shutdown.
    """
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, _raise_keyboard_interrupt)
    # LitServe forks its API server from us: give it back the default SIGTERM, which
    # uvicorn captures (and re-raises on exit) for its own graceful shutdown.
    os.register_at_fork(after_in_child=lambda: signal.signal(signal.SIGTERM, signal.SIG_DFL))
    server = build_server(config or EngineConfig.from_env())
    server.run(host=host, port=port, num_api_servers=1, api_server_worker_type="process",
               generate_client_file=False, log_level=log_level)

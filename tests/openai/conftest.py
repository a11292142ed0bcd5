"""A real float32 engine behind the OpenAI app, driven in-process through httpx's ASGI transport."""
from __future__ import annotations

import httpx
import pytest

from paged_core import AsyncEngine, EngineConfig
from paged_core.openai import build_openai_app

MODEL = "SmolLM2-135M-Instruct"


@pytest.fixture(scope="session")
def engine():
    engine = AsyncEngine(EngineConfig(dtype="float32", num_kv_blocks=256, max_model_len=512))
    try:
        yield engine
    finally:
        engine.shutdown_sync()


@pytest.fixture
def app(engine):
    return build_openai_app(engine)


@pytest.fixture
async def client(app):
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app),
                                 base_url="http://test", timeout=120) as c:
        yield c

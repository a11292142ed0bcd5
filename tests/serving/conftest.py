"""Serving-under-load fixtures: a tiny random Llama (fast steps, real tokenizer) and helpers."""
from __future__ import annotations

import httpx
import pytest


@pytest.fixture(scope="session")
def tiny_folder(tiny_checkpoints):
    """A tiny random-weight Llama with the embedded model's tokenizer (a few ms per step)."""
    return tiny_checkpoints.model("llama")


def asgi_client(app, timeout: float = 60) -> httpx.AsyncClient:
    """An in-process HTTP client of ``app`` (no port, no server process)."""
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://test",
                             timeout=timeout)

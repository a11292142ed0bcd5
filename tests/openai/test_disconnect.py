"""A client that disconnects aborts its engine request (streaming or not), freeing its blocks.

The app is driven as an ASGI server would drive it: ``receive`` answers
``http.disconnect`` once the test decides the client has left.
"""
from __future__ import annotations

import asyncio
import json
import time

from .conftest import MODEL


async def _drive(app, body: dict, disconnect_after_chunks: int | None,
                 disconnect_after_s: float | None = None,
                 sends_to_gone_client: str = "raise") -> list[dict]:
    """Sent messages. After the disconnect, ``send`` raises ``OSError`` (what ASGI spec >= 2.4
    lets a server do) or, with ``sends_to_gone_client="record"``, takes them as uvicorn's
    httptools protocol does (it drops them without a word); the test sees them."""
    payload = json.dumps(body).encode()
    gone = asyncio.Event()
    sent: list[dict] = []
    body_sent = False

    async def receive() -> dict:
        nonlocal body_sent
        if not body_sent:
            body_sent = True
            return {"type": "http.request", "body": payload, "more_body": False}
        await gone.wait()
        return {"type": "http.disconnect"}

    async def send(message: dict) -> None:
        if gone.is_set() and sends_to_gone_client == "raise":
            raise OSError("client disconnected")
        sent.append(message)
        chunks = [m for m in sent if m["type"] == "http.response.body" and m.get("body")]
        if disconnect_after_chunks is not None and len(chunks) >= disconnect_after_chunks:
            gone.set()

    scope = {"type": "http", "asgi": {"version": "3.0", "spec_version": "2.4"},
             "http_version": "1.1", "method": "POST", "scheme": "http",
             "path": "/v1/completions", "raw_path": b"/v1/completions", "query_string": b"",
             "root_path": "", "headers": [(b"content-type", b"application/json")],
             "client": ("127.0.0.1", 50000), "server": ("127.0.0.1", 80)}
    if disconnect_after_s is not None:
        asyncio.get_running_loop().call_later(disconnect_after_s, gone.set)
    await asyncio.wait_for(app(scope, receive, send), timeout=60)
    return sent


async def _assert_freed_within(engine, seconds: float) -> None:
    start = time.monotonic()
    while True:
        stats = engine.stats()
        if stats["num_running"] == 0 and stats["num_waiting"] == 0 and stats["kv_blocks_used"] == 0:
            return
        assert time.monotonic() - start < seconds, stats
        await asyncio.sleep(0.01)


LONG = {"model": MODEL, "prompt": "Once upon a time", "max_tokens": 400, "ignore_eos": True}


async def test_stream_disconnect_aborts_the_request(app, engine):
    start = time.monotonic()
    sent = await _drive(app, {**LONG, "stream": True}, disconnect_after_chunks=3)
    assert sent[0]["status"] == 200
    await _assert_freed_within(engine, 1.0)
    assert time.monotonic() - start < 20  # nowhere near 400 tokens


async def test_non_streaming_disconnect_aborts_the_request(app, engine):
    start = time.monotonic()
    await _drive(app, LONG, disconnect_after_chunks=None, disconnect_after_s=0.5)
    await _assert_freed_within(engine, 1.0)
    assert time.monotonic() - start < 20


async def test_non_streaming_disconnect_still_ends_the_response(app, engine):
    """Where the server takes sends to a gone client, the app ends the response cycle (an
    empty 499): a response never started leaves the request open for the server and the
    middleware around the app (BentoML's graceful shutdown waited for it until its grace ran
    out and the worker was killed)."""
    sent = await _drive(app, LONG, disconnect_after_chunks=None, disconnect_after_s=0.5,
                        sends_to_gone_client="record")
    assert [m["type"] for m in sent] == ["http.response.start", "http.response.body"]
    assert sent[0]["status"] == 499
    assert not sent[1].get("more_body", False)
    await _assert_freed_within(engine, 1.0)

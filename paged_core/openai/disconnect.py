"""Client-disconnect detection for ASGI handlers.

Invariant: work wrapped by ``cancel_on_disconnect`` (or streamed by
``SSEResponse``) is cancelled as soon as the ASGI server reports
``http.disconnect``, even while no token is being produced (queued or long
prefill), so the engine's request is aborted and its KV blocks freed within a
scheduling step of the client leaving.
"""
from __future__ import annotations

from typing import Any, AsyncIterator, Awaitable, Callable, TypeVar

import anyio
from starlette.responses import Response, StreamingResponse
from starlette.types import Receive, Scope, Send

T = TypeVar("T")


class ClientDisconnected(Exception):
    """The client went away before the response was ready."""


class ClientClosedRequest(Response):
    """The response to a client that has left: an empty 499 (nginx's "client closed
    request"), which no client reads.

    It is sent all the same, because middleware around the app may count a request as open
    until its response ends: one that never started (the app returned without sending)
    held BentoML's graceful shutdown until its grace ran out and the worker was killed.
    uvicorn drops sends to a gone client; a server that refuses them (ASGI spec >= 2.4:
    ``OSError``) ends the cycle itself, and that refusal is swallowed here.
    """

    def __init__(self) -> None:
        super().__init__(status_code=499)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        except OSError:
            pass


async def wait_for_disconnect(receive: Receive) -> None:
    """Return once the client disconnects (the request body must already be read)."""
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return


async def cancel_on_disconnect(receive: Receive, work: Callable[[], Awaitable[T]]) -> T:
    """Run ``work()``; cancel it and raise ``ClientDisconnected`` if the client leaves first."""
    result: list[T] = []
    error: list[Exception] = []
    disconnected = False

    async with anyio.create_task_group() as tg:
        async def watch() -> None:
            nonlocal disconnected
            await wait_for_disconnect(receive)
            disconnected = True
            tg.cancel_scope.cancel()

        tg.start_soon(watch)
        try:
            result.append(await work())
        except Exception as exc:  # re-raised below, outside the task group (no ExceptionGroup)
            error.append(exc)
        tg.cancel_scope.cancel()
    if error:
        raise error[0]
    if disconnected and not result:
        raise ClientDisconnected()
    return result[0]


class SSEResponse(StreamingResponse):
    """``text/event-stream`` response that closes its body iterator on disconnect.

    Unlike Starlette's ``StreamingResponse`` (which, under ASGI spec >= 2.4, only
    notices a disconnect on its next ``send`` and never closes the iterator), this
    watches ``receive`` the whole time and always ``aclose()``s the iterator, so
    the generator's ``finally`` (which aborts the engine request) runs at once.
    """

    media_type = "text/event-stream"

    def __init__(self, content: AsyncIterator[str], **kwargs: Any) -> None:
        headers = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
        super().__init__(content, headers=headers, **kwargs)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            async with anyio.create_task_group() as tg:
                async def watch() -> None:
                    await wait_for_disconnect(receive)
                    tg.cancel_scope.cancel()

                tg.start_soon(watch)
                try:
                    await self.stream_response(send)
                except OSError:  # the ASGI server's "client disconnected" on send
                    pass
                tg.cancel_scope.cancel()
        finally:
            with anyio.CancelScope(shield=True):
                await self.body_iterator.aclose()  # type: ignore[attr-defined]

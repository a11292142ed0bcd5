"""OpenAI-shaped errors: ``{"error": {"message", "type", "param", "code"}}``.

Invariant: every error the OpenAI routes return goes through ``error_response``,
so clients always see the same JSON shape, and every 4xx names the offending
request field in ``param`` when one is known. Engine failures map by kind: one
request failed (``RequestFailedError``) -> 500, the server goes on serving; the
engine stopped (``EngineDeadError``) -> 503; the waiting queue is full
(``EngineOverloadedError``) -> 429 with ``Retry-After``; the request outlived
its deadline (``RequestTimeoutError``) -> 408.
"""
from __future__ import annotations

import json
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.responses import JSONResponse

from paged_core import (EngineDeadError, EngineOverloadedError, ParamValidationError,
                        RequestFailedError, RequestTimeoutError)

_TYPES = {400: "invalid_request_error", 404: "invalid_request_error",
          405: "invalid_request_error", 408: "timeout_error", 413: "invalid_request_error",
          429: "rate_limit_error",
          503: "service_unavailable", 500: "internal_server_error"}


class OpenAIError(Exception):
    """An error to report to the client with an HTTP status and an OpenAI error body."""

    def __init__(self, status: int, message: str, param: str | None = None,
                 code: str | None = None, headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.code = code
        self.headers = headers

    def body(self) -> dict[str, Any]:
        return error_body(self.status, self.message, self.param, self.code)


ENGINE_ERRORS = (RequestFailedError, EngineDeadError, EngineOverloadedError, RequestTimeoutError)


def engine_error(exc: Exception) -> OpenAIError:
    """The client's view of an ``ENGINE_ERRORS`` exception (see the module docstring)."""
    if isinstance(exc, EngineOverloadedError):
        return OpenAIError(429, str(exc), code="engine_overloaded",
                           headers={"Retry-After": str(max(1, round(exc.retry_after)))})
    if isinstance(exc, RequestTimeoutError):
        return OpenAIError(408, str(exc), param="timeout", code="request_timeout")
    return OpenAIError(500 if isinstance(exc, RequestFailedError) else 503, str(exc))


def error_body(status: int, message: str, param: str | None = None,
               code: str | None = None) -> dict[str, Any]:
    """The JSON body of an error (also sent as the last SSE event of a failed stream)."""
    return {"error": {"message": message, "type": _TYPES.get(status, "invalid_request_error"),
                      "param": param, "code": code}}


class _ErrorJSONResponse(JSONResponse):
    """JSON with non-ASCII escaped: an error may quote client text holding lone surrogates."""

    def render(self, content: Any) -> bytes:
        return json.dumps(content, separators=(",", ":")).encode("ascii")


def error_response(status: int, message: str, param: str | None = None,
                   code: str | None = None, headers: dict[str, str] | None = None) -> JSONResponse:
    return _ErrorJSONResponse(error_body(status, message, param, code), status_code=status,
                              headers=headers)


def bad_request(exc: ValueError, rename: dict[str, str] | None = None,
                default_param: str | None = None) -> OpenAIError:
    """Turn the engine's refusal into a 400 naming the request field.

    ``param`` is the ``ParamValidationError``'s own (``None`` for the prompt, and for
    any other ``ValueError``: then ``default_param``); ``rename`` maps engine field
    names back to the request's (``max_tokens`` -> ``max_completion_tokens``).
    """
    param = (exc.param if isinstance(exc, ParamValidationError) else None) or default_param
    if rename and param in rename:
        param = rename[param]
    return OpenAIError(400, str(exc), param=param)


def _validation_message(exc: RequestValidationError) -> tuple[str, str | None]:
    errors = exc.errors()
    if not errors:
        return "Invalid request body", None
    first = errors[0]
    loc = [str(p) for p in first.get("loc", ()) if p != "body"]
    if first.get("type") == "json_invalid":
        return f"Invalid JSON in request body: {first.get('ctx', {}).get('error', first.get('msg'))}", None
    param = loc[0] if loc else None  # the top-level request field
    parts = []
    for err in errors[:5]:
        where = ".".join(str(p) for p in err.get("loc", ()) if p != "body") or "body"
        parts.append(f"{where}: {err.get('msg')}")
    return "Invalid request: " + "; ".join(parts), param


def install_error_handlers(app: FastAPI) -> None:
    """Make every error of the app OpenAI-shaped (FastAPI's own 404/405 included).

    Malformed JSON and schema errors become 400 (not FastAPI's 422), as OpenAI
    does; an engine that stopped is 503; anything unexpected is logged and 500.
    """

    @app.exception_handler(OpenAIError)
    async def _openai_error(_: Request, exc: OpenAIError) -> JSONResponse:
        return error_response(exc.status, exc.message, exc.param, exc.code, exc.headers)

    @app.exception_handler(RequestValidationError)
    async def _validation_error(_: Request, exc: RequestValidationError) -> JSONResponse:
        message, param = _validation_message(exc)
        return error_response(400, message, param)

    async def _engine_failure(_: Request, exc: Exception) -> JSONResponse:
        error = engine_error(exc)
        return error_response(error.status, error.message, error.param, error.code, error.headers)

    for kind in ENGINE_ERRORS:
        app.add_exception_handler(kind, _engine_failure)

    @app.exception_handler(Exception)
    async def _unexpected(_: Request, exc: Exception) -> JSONResponse:
        # Starlette's ServerErrorMiddleware re-raises after this, so the server logs it.
        return error_response(500, f"internal error: {type(exc).__name__}: {exc}")

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(_: Request, exc: StarletteHTTPException) -> JSONResponse:
        detail = exc.detail if isinstance(exc.detail, str) else json.dumps(exc.detail)
        return error_response(exc.status_code, detail)

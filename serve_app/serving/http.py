"""HTTP answers for every FastAPI app of the project: each exception of the error table
(:mod:`serve_app.errors`) as its status in OpenAI's envelope (``Retry-After`` on what may be retried), pydantic's
refusals as 400 naming the field (422 on the seeds' ``/generate``), and Server-Sent Events that end with an error
event when a stream fails after its status line has gone out (as vLLM's server sends it), then ``[DONE]``."""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncIterator, Callable
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import Response, StreamingResponse

from ..errors import ERROR_TABLE, error_body, exception_body, retry_after, validation_error
from ..openai.sse import DONE, sse

logger = logging.getLogger("serve_app")


def error_response(status: int, message: str, param: str | None = None, retry_after_s: int | None = None) -> Response:
    """A JSON error in OpenAI's envelope (with ``Retry-After`` when the client should retry)."""
    body = json.dumps(error_body(status, message, param), ensure_ascii=True)
    headers = {"Retry-After": str(retry_after_s)} if retry_after_s is not None else None
    return Response(body, status_code=status, headers=headers, media_type="application/json")


def exception_response(exc: BaseException) -> Response:
    """``exc`` answered as the error table says."""
    kind, body = exception_body(exc)
    if kind.status >= 500 and not kind.retry:
        logger.warning("request failed: %r", exc)
    error = body["error"]
    return error_response(kind.status, error["message"], error["param"], retry_after(exc) if kind.retry else None)


async def _answer(_: Request, exc: Exception) -> Response:
    return exception_response(exc)


SEED_ROUTES = frozenset({"/generate"})
"""Routes of the seeds' API, a FastAPI app, whose clients get FastAPI's 422 for a malformed body; OpenAI's routes
answer it with a 400, as OpenAI and vLLM's server do (OpenAI's clients raise ``BadRequestError`` for it)."""


async def _invalid(request: Request, exc: RequestValidationError) -> Response:
    """400 (422 on :data:`SEED_ROUTES`) naming each bad field (FastAPI's own handler echoes the input unescaped)."""
    error = validation_error(exc.errors())
    status = 422 if getattr(request.scope.get("route"), "path", None) in SEED_ROUTES else 400
    return error_response(status, str(error), error.param)


def install_error_handlers(app: FastAPI) -> None:
    """Answer the project's exceptions on ``app`` as the error table says; anything else is a 500 in the
    envelope."""
    app.add_exception_handler(RequestValidationError, _invalid)
    for cls, _ in ERROR_TABLE:
        app.add_exception_handler(cls, _answer)
    app.add_exception_handler(Exception, _answer)


def event_stream(events: AsyncIterator[str], last: Callable[[], Any] | None = None) -> StreamingResponse:
    """Server-Sent Events: ``events``, then ``last()`` if it gives a payload, then ``[DONE]``. A failure once the
    stream is under way is sent as an error event in OpenAI's envelope (the status line has already gone out)."""

    async def body() -> AsyncIterator[str]:
        try:
            async for event in events:
                yield event
            payload = last() if last is not None else None
            end = DONE if payload is None else sse(payload) + DONE
        except Exception as exc:
            logger.warning("stream failed: %r", exc)
            end = sse(exception_body(exc)[1]) + DONE
        yield end  # one write for the stream's end: a write is most of what a chunk costs

    return StreamingResponse(body(), media_type="text/event-stream", headers={"Cache-Control": "no-cache"})

"""Errors as HTTP answers in OpenAI's envelope (``{"error": {"message", "type", "param", "code"}}``), shared
by every FastAPI app of the project (generation and embeddings), so each failure maps to one status:
bad input 400/404/422, overload and shutdown 503 + Retry-After, a dead engine 503, a timeout 504."""

from __future__ import annotations

import json
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import Response

from batching import BatcherStoppedError, QueueFullError

from .engines.base import EngineDeadError
from .openai_format import error_body
from .validation import RequestError

RETRY_AFTER_S = 1
"""Seconds a client is told to wait (``Retry-After``) when the replica is overloaded or restarting."""


def error_response(
    status: int, message: str, param: str | None = None, headers: dict[str, str] | None = None
) -> Response:
    """A JSON error in OpenAI's envelope."""
    body = json.dumps(error_body(status, message, param), ensure_ascii=True)
    return Response(body, status_code=status, headers=headers, media_type="application/json")


def retry_response(status: int, message: str) -> Response:
    """An error the client should retry after ``Retry-After`` seconds."""
    return error_response(status, message, headers={"Retry-After": str(RETRY_AFTER_S)})


def preview(value: Any, limit: int = 200) -> str:
    """A short, always-encodable rendering of a bad input value."""
    text = value.decode("utf-8", "backslashreplace") if isinstance(value, bytes) else repr(value)
    text = text.encode("utf-8", "backslashreplace").decode("utf-8")
    return text if len(text) <= limit else text[:limit] + "..."


_TYPE_TAGS = {"str", "int", "float", "bool", "dict", "list", "none"}


def field_path(loc: tuple | list) -> str:
    """A validation error's field as a dotted path (``messages.0.content``), without the ``body`` root and
    without the union-member tags pydantic adds (``str``, ``list[int]``, ``function-after[...]``)."""
    parts = []
    for part in list(loc)[1:] if loc and loc[0] == "body" else list(loc):
        if isinstance(part, str) and (part in _TYPE_TAGS or not part.isidentifier()):
            break
        parts.append(str(part))
    return ".".join(parts) or "body"


async def _invalid(_: Request, exc: RequestValidationError) -> Response:
    """422 naming each bad field. FastAPI's own handler echoes the input back and fails with a 500 when it
    cannot be encoded (bytes that are not UTF-8, lone surrogates): here it is escaped."""
    errors = exc.errors()
    problems = dict.fromkeys(
        f"{field_path(e.get('loc', ()))}: {e.get('msg')} (got {preview(e.get('input'))})" for e in errors
    )
    first = field_path(errors[0].get("loc", ())) if errors else "body"
    return error_response(422, f"invalid request: {'; '.join(problems)}", first)


async def _bad_request(_: Request, exc: RequestError) -> Response:
    return error_response(exc.status, str(exc), exc.param)


async def _overloaded(_: Request, exc: QueueFullError) -> Response:
    return retry_response(503, f"server overloaded, retry later: {exc}")


async def _stopping(_: Request, exc: BatcherStoppedError) -> Response:
    return retry_response(503, f"replica shutting down, retry: {exc}")


async def _engine_dead(_: Request, exc: EngineDeadError) -> Response:
    return retry_response(503, f"engine unavailable, retry: {exc}")


async def _timeout(_: Request, exc: TimeoutError) -> Response:
    return error_response(504, f"request timed out: {exc}")


def install_error_handlers(app: FastAPI) -> None:
    """Map the project's exceptions to their HTTP answers on ``app``."""
    app.add_exception_handler(RequestValidationError, _invalid)
    app.add_exception_handler(RequestError, _bad_request)
    app.add_exception_handler(QueueFullError, _overloaded)
    app.add_exception_handler(BatcherStoppedError, _stopping)
    app.add_exception_handler(EngineDeadError, _engine_dead)
    app.add_exception_handler(TimeoutError, _timeout)

"""The project's exception family and its one error table: what each failure is called, which HTTP status and
OpenAI error type it answers with, and whether a client should retry it (``503`` + ``Retry-After``).

Every path reports a failure through this table: HTTP routes (:mod:`serve_app.serving.http`), an error event
in a stream already under way, ``DeploymentHandle`` callers (who get the exception itself) and Ray Data jobs
(which retry what the table calls retryable and write the rest into the row).

=====================================  ======  =======================================================
exception                              status  when
=====================================  ======  =======================================================
:class:`RequestError` (``ValueError``)  400     bad input that parsed: no prompts, too long, a field we cannot honour
:class:`NotFoundError`                 404     the request names a model or a stored response this server lacks
:class:`GenerationError`               500     the engine failed (or aborted) one prompt of the request
``batching.QueueFullError``            503     the replica's queue is full: retry after ``Retry-After``
``batching.BatcherStoppedError``       503     the replica is shutting down: retry
:class:`EngineDeadError`               503     the engine died; Serve replaces the replica: retry
``TimeoutError``                       504     the request outlived ``request_timeout_s``
=====================================  ======  =======================================================
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from batching import BatcherStoppedError, QueueFullError

RETRY_AFTER_S = 1
"""The shortest wait a client is told (``Retry-After``, seconds) on a 503, and the one it is told when there is no
basis for an estimate (a replica restarting, a batcher that has seen nothing finish yet)."""

MAX_RETRY_AFTER_S = 60
"""The longest: past this a client should rather hear from a load balancer or try another deployment."""


def retry_after(exc: BaseException) -> int:
    """Seconds until a refused request would likely be admitted: the batcher's estimate from its queue and its
    recent drain rate (``QueueFullError.retry_after_s``), rounded up and bounded to [1 s, 60 s]."""
    estimate = getattr(exc, "retry_after_s", None)
    if estimate is None:
        return RETRY_AFTER_S
    return max(RETRY_AFTER_S, min(MAX_RETRY_AFTER_S, math.ceil(estimate)))


class RequestError(ValueError):
    """Bad input, with a message that names the problem; ``param`` names the offending field where there is one.
    A ``ValueError``, so that it reaches a ``DeploymentHandle`` caller as one."""

    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.param = param


class NotFoundError(RequestError):
    """What the request names is not here: a model, a stored response (404, as vLLM answers)."""


class ModelNotFoundError(NotFoundError):
    """The request names a model this server does not serve (404, as vLLM answers)."""

    def __init__(self, message: str) -> None:
        super().__init__(message, param="model")


class GenerationError(RuntimeError):
    """The engine failed, or aborted, a prompt of the request while its caller still waited for it."""


class EngineDeadError(RuntimeError):
    """The engine cannot serve any more requests; the replica's health check fails and Serve replaces it."""


@dataclass(frozen=True)
class ErrorKind:
    """How one kind of failure is answered: its HTTP status, whether to retry, and the message's lead-in."""

    status: int
    retry: bool = False
    prefix: str = ""


ERROR_TABLE: tuple[tuple[type[BaseException], ErrorKind], ...] = (
    (NotFoundError, ErrorKind(404)),
    (RequestError, ErrorKind(400)),
    (GenerationError, ErrorKind(500)),
    (QueueFullError, ErrorKind(503, True, "server overloaded, retry later: ")),
    (BatcherStoppedError, ErrorKind(503, True, "replica shutting down, retry: ")),
    (EngineDeadError, ErrorKind(503, True, "engine unavailable, retry: ")),
    (TimeoutError, ErrorKind(504, False, "request timed out: ")),
)
"""Exception class -> how it is answered; the first matching row wins (subclasses come first)."""

UNEXPECTED = ErrorKind(500)

OPENAI_TYPES = {
    400: "BadRequestError",
    401: "AuthenticationError",
    404: "NotFoundError",
    413: "RequestTooLargeError",
    422: "BadRequestError",
    500: "InternalServerError",
    503: "ServiceUnavailableError",
    504: "TimeoutError",
}
"""OpenAI's error type for each status (the ``type`` of the envelope), as vLLM's server names them."""


def classify(exc: BaseException) -> ErrorKind:
    """The table's row for ``exc`` (an unexpected exception is a 500)."""
    for cls, kind in ERROR_TABLE:
        if isinstance(exc, cls):
            return kind
    return UNEXPECTED


def describe(exc: BaseException) -> tuple[ErrorKind, str]:
    """``exc``'s row and the message a client reads (an unexpected one names its type)."""
    kind = classify(exc)
    message = str(exc) if kind is not UNEXPECTED else f"{type(exc).__name__}: {exc}"
    return kind, kind.prefix + message


def error_body(status: int, message: str, param: str | None = None) -> dict[str, Any]:
    """OpenAI's error envelope, as vLLM's server sends it."""
    kind = OPENAI_TYPES.get(status, "Error")
    return {"error": {"message": message, "type": kind, "param": param, "code": status}}


def exception_body(exc: BaseException) -> tuple[ErrorKind, dict[str, Any]]:
    """``exc``'s row and its envelope (``param`` from a :class:`RequestError`)."""
    kind, message = describe(exc)
    return kind, error_body(kind.status, message, getattr(exc, "param", None))


def preview(value: Any, limit: int = 200) -> str:
    """A short, always-encodable rendering of a bad input value."""
    text = value.decode("utf-8", "backslashreplace") if isinstance(value, bytes) else repr(value)
    text = text.encode("utf-8", "backslashreplace").decode("utf-8")
    return text if len(text) <= limit else text[:limit] + "..."


_TYPE_TAGS = {"str", "int", "float", "bool", "dict", "list", "none"}


def field_path(loc: Iterable[Any]) -> str:
    """A validation error's field as a dotted path (``messages.0.content``), without FastAPI's ``body`` root and
    without the union-member tags pydantic adds (``str``, ``list[int]``, ``function-after[...]``)."""
    loc = list(loc)
    parts = []
    for part in loc[1:] if loc and loc[0] == "body" else loc:
        if isinstance(part, str) and (part in _TYPE_TAGS or not part.isidentifier()):
            break
        parts.append(str(part))
    return ".".join(parts) or "body"


def validation_error(errors: list[dict[str, Any]]) -> RequestError:
    """One :class:`RequestError` naming each field pydantic refused, with what it got (escaped: FastAPI's own
    handler echoes the input and fails with a 500 on bytes that are not UTF-8 or on lone surrogates)."""
    problems = dict.fromkeys(
        f"{field_path(e.get('loc', ()))}: {e.get('msg')} (got {preview(e.get('input'))})" for e in errors
    )
    first = field_path(errors[0].get("loc", ())) if errors else "body"
    return RequestError(f"invalid request: {'; '.join(problems)}", param=first)

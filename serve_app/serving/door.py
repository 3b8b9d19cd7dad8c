"""The door of every HTTP app: an optional API key and a request-body limit, checked before a route runs.

What: a pure ASGI middleware (:class:`Door`) that, for each HTTP request,

1. answers 401 (OpenAI's error envelope, ``WWW-Authenticate: Bearer``) unless the request carries
   ``Authorization: Bearer <key>``, when a key is set (``api_key``, or the ``SERVE_APP_API_KEY`` environment
   variable); ``/health`` and ``/healthz`` stay open, for load balancers and probes;
2. answers 413 for a body larger than ``max_request_body_bytes``, before it is parsed: at once from its
   ``Content-Length`` (400 for a malformed one), or, for a chunked body, as soon as the bytes received pass
   the limit (the rest is never read).

Why here and not in the routes: FastAPI reads and parses a body before a route (or a dependency) can look
at its size, and a forgotten dependency on one route would leave it open; a middleware sees every route,
those added later and FastAPI's own (``/docs``, ``/openapi.json``) included. Why pure ASGI and not
Starlette's ``BaseHTTPMiddleware``: that one wraps every response in a stream of its own, and is known to
break or delay streamed responses (Server-Sent Events) and client disconnects; this one passes messages
through untouched, and with a valid ``Content-Length`` it does not even wrap them.

``DeploymentHandle`` calls never pass through FastAPI, so neither check applies to them: the key guards
the HTTP port; code inside the Ray cluster is trusted already.

Use (any FastAPI app, one line each)::

    api = FastAPI(...)
    door.install(api)               # at import, BEFORE @serve.ingress(api), which freezes a copy of the app

    class MyServer:
        async def __init__(self, config):
            door.configure(api, config)   # in the replica, with its validated config

``configure`` resolves the key in the replica's process (where the environment variable is read). Its
settings are kept in this module, by a key that :func:`install` gives the app: ``@serve.ingress`` serves a
pickled copy of the app object, so the settings cannot live on ``api.state`` (the copy has its own).
"""

from __future__ import annotations

import hmac
import json
import logging
import uuid
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from fastapi import FastAPI

from ..config import API_KEY_ENV, DeploymentConfig
from ..errors import RETRY_AFTER_S, error_body

logger = logging.getLogger("serve_app")

PUBLIC_PATHS = ("/health", "/healthz", "/ping", "/version")
"""Paths open without a key: health probes (load balancers, Kubernetes, SageMaker's `/ping`) do not hold one, and
vLLM's server leaves its `/version` open too."""

_STATE_KEY = "door_key"
_MAX_LENGTH_DIGITS = 18  # a longer Content-Length is over any limit (and int() of a huge string is costly)

Scope = dict[str, Any]
Message = dict[str, Any]


@dataclass(frozen=True)
class DoorSettings:
    """What one app's door checks: the key as bytes (None: no key) and the body limit."""

    api_key: bytes | None = field(repr=False)
    max_body_bytes: int

    @classmethod
    def from_config(cls, config: DeploymentConfig) -> DoorSettings:
        key = config.effective_api_key()
        return cls(None if key is None else key.get_secret_value().encode("ascii"), config.max_request_body_bytes)


_SETTINGS: dict[str, DoorSettings] = {}


def install(api: FastAPI, public_paths: Iterable[str] = PUBLIC_PATHS) -> None:
    """Put the door in front of every route of ``api``. Call it at import time, right after creating the
    app: ``@serve.ingress(api)`` serves a copy of the app as it is when the class is decorated."""
    if hasattr(api.state, _STATE_KEY):
        raise RuntimeError("door.install: this app has a door already")
    key = uuid.uuid4().hex
    setattr(api.state, _STATE_KEY, key)
    api.add_middleware(Door, key=key, public_paths=tuple(public_paths))


def configure(api: FastAPI, config: DeploymentConfig) -> DoorSettings:
    """Arm ``api``'s door with ``config`` (in the replica's ``__init__``: the environment variable is read
    there). Calling it again replaces the settings."""
    key = getattr(api.state, _STATE_KEY, None)
    if key is None:
        raise RuntimeError("door.configure: call door.install(api) first, at import time")
    settings = DoorSettings.from_config(config)
    _SETTINGS[key] = settings
    source = "none" if settings.api_key is None else "api_key" if config.api_key is not None else API_KEY_ENV
    logger.info("HTTP door: API key from %s, bodies up to %d bytes", source, settings.max_body_bytes)
    return settings


def _json_response(status: int, message: str, headers: Iterable[tuple[bytes, bytes]] = ()) -> list[Message]:
    body = json.dumps(error_body(status, message), ensure_ascii=True).encode()
    start_headers = [
        (b"content-type", b"application/json"),
        (b"content-length", str(len(body)).encode()),
        *headers,
    ]
    return [
        {"type": "http.response.start", "status": status, "headers": start_headers},
        {"type": "http.response.body", "body": body, "more_body": False},
    ]


def _route_path(scope: Scope) -> str:
    """The path the app routes on: ``path`` less a mount's ``root_path`` (Serve's route prefix), as Starlette
    computes it."""
    path, root = scope.get("path", ""), scope.get("root_path", "")
    if root and path.startswith(root) and (len(path) == len(root) or path[len(root)] == "/"):
        return path[len(root) :]
    return path


def _headers(scope: Scope, name: bytes) -> list[bytes]:
    return [value for key, value in scope.get("headers", ()) if key.lower() == name]


class _BadLength(ValueError):
    pass


def _declared_length(scope: Scope) -> int | None:
    """The request's ``Content-Length`` (None when absent); :class:`_BadLength` when it is malformed, when
    copies disagree, or when it comes with ``Transfer-Encoding`` (a request-smuggling shape)."""
    values = {value.strip(b" \t") for value in _headers(scope, b"content-length")}
    if not values:
        return None
    if len(values) > 1:
        raise _BadLength("conflicting Content-Length headers")
    (value,) = values
    if not value.isdigit():  # bytes.isdigit: ASCII digits only; no sign, space, underscore or comma list
        raise _BadLength("malformed Content-Length header")
    if _headers(scope, b"transfer-encoding"):
        raise _BadLength("both Content-Length and Transfer-Encoding")
    return int(value) if len(value) <= _MAX_LENGTH_DIGITS else 10**_MAX_LENGTH_DIGITS


class Door:
    """The ASGI middleware (see the module's docstring). ``key`` names its settings, set by
    :func:`configure`; ``public_paths`` are open without an API key."""

    def __init__(self, app: Any, key: str, public_paths: tuple[str, ...] = PUBLIC_PATHS) -> None:
        self.app, self.key, self.public_paths = app, key, frozenset(public_paths)
        self._warned = False

    async def __call__(self, scope: Scope, receive: Any, send: Any) -> None:
        kind = scope["type"]
        if kind not in ("http", "websocket"):  # lifespan
            await self.app(scope, receive, send)
            return
        settings = _SETTINGS.get(self.key)
        if settings is None:
            # Not configured: fail closed. Serve routes no request to a replica before its __init__ (which
            # configures the door) has returned, so this only happens when an app installs the door and
            # forgets configure(): better every request refused, visibly, than a key silently not enforced.
            if not self._warned:
                self._warned = True
                logger.error("HTTP door not configured: call door.configure(api, config) in the replica's __init__")
            await self._refuse(scope, send, 503, "server not ready", [(b"retry-after", str(RETRY_AFTER_S).encode())])
            return
        if settings.api_key is not None and _route_path(scope) not in self.public_paths:
            problem = self._unauthorized(scope, settings.api_key)
            if problem:
                await self._refuse(scope, send, 401, problem, [(b"www-authenticate", b"Bearer")])
                return
        if kind == "websocket":
            await self.app(scope, receive, send)
            return
        try:
            length = _declared_length(scope)
        except _BadLength as exc:
            await self._refuse(scope, send, 400, f"bad request: {exc}", [(b"connection", b"close")])
            return
        limit = settings.max_body_bytes
        if length is not None and length > limit:
            await self._refuse(scope, send, 413, self._too_large(limit), [(b"connection", b"close")])
            return
        if length is not None:
            # The server delivers at most the declared length (h11 and httptools frame the body by it):
            # nothing to count, and the messages, streamed responses included, go through untouched.
            await self.app(scope, receive, send)
            return
        await self._counted(scope, receive, send, limit)

    @staticmethod
    def _unauthorized(scope: Scope, key: bytes) -> str | None:
        """Why the request may not pass (None: it may)."""
        values = _headers(scope, b"authorization")
        if not values:
            return "missing API key: send the header 'Authorization: Bearer <key>'"
        if len(values) > 1:
            return "more than one Authorization header"
        scheme, _, token = values[0].strip(b" \t").partition(b" ")
        if scheme.lower() != b"bearer" or not hmac.compare_digest(token.strip(b" \t"), key):
            return "invalid API key"
        return None

    @staticmethod
    def _too_large(limit: int) -> str:
        return f"request body too large: the limit is {limit} bytes (max_request_body_bytes)"

    @staticmethod
    async def _refuse(scope: Scope, send: Any, status: int, message: str, headers: list[tuple[bytes, bytes]]) -> None:
        if scope["type"] == "websocket":  # closing before accepting makes the server answer 403
            await send({"type": "websocket.close", "code": 1013 if status == 503 else 1008, "reason": message})
            return
        for event in _json_response(status, message, headers):
            await send(event)

    async def _counted(self, scope: Scope, receive: Any, send: Any, limit: int) -> None:
        """Run the app on a body of unknown length (chunked): count its bytes as the app receives them; past
        the limit, tell the app the client left (it stops reading), drop its answer, and answer 413."""
        received = 0
        over = started = False

        async def counted_receive() -> Message:
            nonlocal received, over
            if over:
                return {"type": "http.disconnect"}
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > limit:
                    over = True
                    return {"type": "http.disconnect"}
            return message

        async def guarded_send(message: Message) -> None:
            nonlocal started
            if over:
                return  # the app's reaction to the "disconnect" (FastAPI: a 400): the 413 replaces it
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, counted_receive, guarded_send)
        except Exception:
            if not over:
                raise
        if over:
            if started:  # the app answered before reading the whole body: too late for a status; cut it off
                raise RuntimeError(f"request body over {limit} bytes after the response started")
            logger.info("413: a chunked body passed %d bytes", limit)
            for event in _json_response(413, self._too_large(limit), [(b"connection", b"close")]):
                await send(event)

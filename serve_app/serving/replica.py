"""What every replica of the project reports the same way, whichever app it serves: who it is, its model
card for ``/v1/models``, and its health answer."""

from __future__ import annotations

import os
import time
from collections.abc import Awaitable, Callable
from typing import Any

from fastapi.responses import JSONResponse, Response

from .http_errors import error_response


def identity() -> dict[str, Any]:
    """The replica's id, application, deployment and process (``stats()`` shows it)."""
    from ray import serve

    context = serve.get_replica_context()
    return {
        "replica_id": str(context.replica_id.unique_id),
        "app": context.app_name,
        "deployment": context.deployment,
        "pid": os.getpid(),
    }


def model_card(name: str, root: str, max_model_len: int) -> dict[str, Any]:
    """An OpenAI model entry, with vLLM's ``root`` and ``max_model_len``."""
    return {
        "id": name,
        "object": "model",
        "created": int(time.time()),
        "owned_by": "token-batching",
        "root": root,
        "parent": None,
        "max_model_len": max_model_len,
    }


async def health(check: Callable[[], Awaitable[None]], engine: str, model: str) -> Response:
    """200 when ``check`` passes, else 503 saying why (``/health`` as vLLM's server, ``/healthz`` too)."""
    try:
        await check()
    except Exception as exc:
        return error_response(503, f"unhealthy: {exc}")
    return JSONResponse({"status": "ok", "engine": engine, "model": model})

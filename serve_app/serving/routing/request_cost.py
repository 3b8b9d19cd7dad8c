"""What a request will cost a replica, estimated before it arrives there (the router never tokenizes): prompt
tokens + ``max_tokens`` per prompt, in the batcher's unit. Handle calls from their arguments; HTTP requests from
Serve's proxy from their ``Content-Length`` (the body is not read yet); HTTP bodies that HAProxy hands the ingress
router as the handle call of the same shape (:func:`body_call`)."""

from __future__ import annotations

import pickle
from collections.abc import Sequence
from typing import Any

CHARS_PER_TOKEN = 4
"""Characters per token when a prompt is text (the router never tokenizes)."""

GENERATING = {"generate", "generate_stream", "generate_batch", "chat", "chat_stream"}
"""Handle methods whose cost is read from their arguments (``generate_batch``: one prompt per list item)."""

FREE = {"stats", "model_card", "model_cards", "check_health"}
"""Handle methods that generate nothing: they cost no tokens."""

COST_FIELDS = ("prompts", "prompt", "messages", "max_tokens", "max_completion_tokens", "n", "model")
"""The arguments :func:`handle_cost` reads (by keyword), and the ``model`` the router's adapter score reads."""


def text_tokens(value: Any) -> float | None:
    """Estimated tokens of a prompt: a string (characters / 4), token ids (one each), chat messages or content
    parts (their text); ``None`` when it is none of these."""
    if isinstance(value, str):
        return len(value) / CHARS_PER_TOKEN
    if isinstance(value, dict):
        parts = [text_tokens(value[key]) for key in ("content", "text") if value.get(key) is not None]
        return sum(p for p in parts if p is not None)
    if isinstance(value, (list, tuple)):
        if all(isinstance(item, int) for item in value):
            return float(len(value))
        parts = [text_tokens(item) for item in value]
        return None if any(p is None for p in parts) else sum(parts)  # type: ignore[misc]
    return None


def _positive_int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


def handle_prompt(method: str, args: Sequence[Any], kwargs: dict[str, Any]) -> Any:
    """The prompt argument of a generating handle call (``generate_batch``: its list of prompts), else ``None``."""
    if method not in GENERATING:
        return None
    key = "prompts" if method == "generate_batch" else "messages" if method.startswith("chat") else "prompt"
    return args[0] if args else kwargs.get(key)


def handle_cost(method: str, args: Sequence[Any], kwargs: dict[str, Any], default_max_tokens: int) -> float | None:
    """A handle call's tokens (prompt + max_tokens per prompt, x ``n``), or ``None`` when its arguments say nothing
    readable (then the caller prices it at a constant)."""
    if method in FREE:
        return 0.0
    if method not in GENERATING:
        return None
    given = handle_prompt(method, args, kwargs)
    max_tokens = (
        _positive_int(kwargs.get("max_tokens"))
        or _positive_int(kwargs.get("max_completion_tokens"))
        or default_max_tokens
    )
    n = _positive_int(kwargs.get("n")) or 1
    prompts = given if method == "generate_batch" else [given]
    if not isinstance(prompts, (list, tuple)):
        return None
    tokens = [text_tokens(p) for p in prompts]
    if any(t is None for t in tokens):
        return None
    return n * sum(t + max_tokens for t in tokens)  # type: ignore[operator]


def asgi_scope(arg: Any) -> dict[str, Any] | None:
    """The ASGI scope of an HTTP request from Serve's proxy: its argument is a pickled ``StreamingHTTPRequest``
    (pickled by the proxy itself, in this process), or the object."""
    if isinstance(arg, (bytes, bytearray)):
        try:
            arg = pickle.loads(arg)
        except Exception:
            return None
    scope = getattr(arg, "asgi_scope", None)
    return scope if isinstance(scope, dict) else None


def http_cost(scope: dict[str, Any], default_max_tokens: int) -> float | None:
    """An HTTP request's tokens before its body is read: ``Content-Length`` / 4 + ``default_max_tokens``; a GET
    (or HEAD) costs 0; ``None`` without a length."""
    if scope.get("method", "").upper() in ("GET", "HEAD"):
        return 0.0
    for name, value in scope.get("headers", []):
        if name.lower() == b"content-length":
            try:
                return int(value) / CHARS_PER_TOKEN + default_max_tokens
            except ValueError:
                return None
    return None


RESPONSES_FIELDS = ("instructions", "max_output_tokens", "previous_response_id")
"""Fields only a Responses API body has (beside ``input``, which an embeddings body has too)."""


def body_call(body: Any) -> tuple[str, dict[str, Any]]:
    """The handle call an HTTP body is priced as, and the keyword arguments that price it (:func:`handle_cost`):
    ``/generate``'s ``prompts`` as ``generate_batch``, chat ``messages`` as ``chat``, a completion's ``prompt`` as
    ``generate``, a Responses API body as ``chat`` (:func:`responses_fields`); anything else (unparsable, another
    route) as ``__call__``, which is priced at a constant."""
    if not isinstance(body, dict):
        return "__call__", {}
    fields = {key: body[key] for key in COST_FIELDS if key in body}
    for key, method in (("prompts", "generate_batch"), ("messages", "chat"), ("prompt", "generate")):
        if key in fields:
            return method, fields
    is_items = isinstance(body.get("input"), list) and all(isinstance(item, dict) for item in body["input"])
    if "input" in body and (is_items or any(key in body for key in RESPONSES_FIELDS)):
        return "chat", responses_fields(body)
    return "__call__", {}


def responses_fields(body: dict[str, Any]) -> dict[str, Any]:
    """A Responses API body as a chat call's fields: ``instructions`` and the ``input`` messages as ``messages`` (a
    follow-up's new turn alone: the conversation before it is stored on the server), ``max_output_tokens`` as
    ``max_tokens``, its ``model`` and ``previous_response_id``."""
    given, instructions = body["input"], body.get("instructions")
    items = [{"role": "user", "content": given}] if isinstance(given, str) else given if isinstance(given, list) else []
    messages = [{"role": "system", "content": instructions}] if isinstance(instructions, str) else []
    for item in items:  # messages; a function call or its output says nothing of the prompt's start
        if isinstance(item, dict) and isinstance(item.get("role"), str):
            messages.append({"role": item["role"], "content": item.get("content")})
    fields = {"messages": messages, "max_tokens": body.get("max_output_tokens")}
    fields |= {key: body[key] for key in ("model", "previous_response_id") if key in body}
    return {key: value for key, value in fields.items() if value is not None}


def previous_response(method: str, args: Sequence[Any], kwargs: dict[str, Any]) -> Any:
    """The ``previous_response_id`` a call continues: a Responses body's under the ingress router, or the body of a
    handle's ``openai("/v1/responses", body)``; None for any other call."""
    if method == "openai":
        url, body = (args[0] if args else kwargs.get("url")), (args[1] if len(args) > 1 else kwargs.get("body"))
        return body.get("previous_response_id") if url == "/v1/responses" and isinstance(body, dict) else None
    return kwargs.get("previous_response_id")


def pending_cost(request: Any, default_max_tokens: int) -> float | None:
    """Tokens a request Serve is routing (its ``PendingRequest``) will hold, from its handle call's arguments or
    its HTTP scope; ``None`` when neither tells."""
    if request.metadata.is_http_request:
        scope = asgi_scope(request.args[0]) if request.args else None
        return http_cost(scope, default_max_tokens) if scope is not None else None
    return handle_cost(request.metadata.call_method, request.args, request.kwargs, default_max_tokens)

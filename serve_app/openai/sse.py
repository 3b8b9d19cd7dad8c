"""Server-Sent Events framing of the OpenAI streams: an event of a JSON payload, the stream's end, and a template
for the chunks that differ only in their text."""

from __future__ import annotations

import json
from typing import Any

from pydantic_core import to_json

DONE = "data: [DONE]\n\n"


def sse(payload: Any, event: str | None = None) -> str:
    """One Server-Sent Event carrying a JSON payload (a pydantic model or a dict), named where ``event`` is given
    (the Responses API's events are)."""
    data = payload.model_dump_json(exclude_unset=True) if hasattr(payload, "model_dump_json") else json.dumps(payload)
    return f"event: {event}\ndata: {data}\n\n" if event else f"data: {data}\n\n"


TEXT_MARK = "\x00text\x00"
"""The text a :class:`TextEvent`'s template is rendered with, where each chunk's text goes."""


class TextEvent:
    """The Server-Sent Event of a stream chunk that differs from others only in its text, rendered once by the chunk's
    own model (``chunk``, made with :data:`TEXT_MARK` as its text): each such chunk then costs its text's JSON
    (pydantic's encoder, as the model's) instead of models built and dumped, and is the string :func:`sse` makes."""

    __slots__ = ("_head", "_tail")

    def __init__(self, chunk: Any) -> None:
        self._head, self._tail = sse(chunk).split(to_json(TEXT_MARK).decode())

    def __call__(self, text: str) -> str:
        return self._head + to_json(text).decode() + self._tail

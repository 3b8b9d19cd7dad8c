"""The row a core's ``rows()`` gives for an input that failed, which a Ray Data job also writes in its place. Kept
apart from the cores so that a job's map actors import it without the engines."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from ..errors import RequestError


async def answer_rows(
    inputs: Sequence[Any],
    run: Callable[[list[Any]], Awaitable[Sequence[Any]]],
    answer: Callable[[Any, Any], dict[str, Any]],
    error_row: Callable[[str], dict[str, Any]],
) -> list[dict[str, Any]]:
    """Each input's row, in order: a refused input (a :class:`RequestError` in ``inputs``) its ``error_row``, the
    others run together (``run``: their outcomes, in order), each made a row by ``answer(input, outcome)``. A bad
    input fails alone."""
    valid = [item for item in inputs if not isinstance(item, RequestError)]
    outcomes = iter(await run(valid) if valid else [])
    return [
        error_row(f"invalid: {item}") if isinstance(item, RequestError) else answer(item, next(outcomes))
        for item in inputs
    ]


def generation_error_row(message: str) -> dict[str, Any]:
    """The row of a prompt that failed: no text, ``error`` set."""
    return {"text": "", "prompt_tokens": 0, "output_tokens": 0, "finish_reason": "error", "error": message}


def chat_error_row(message: str) -> dict[str, Any]:
    """The row of a conversation that failed: a generation's error row, no content, calls or thoughts."""
    return {**generation_error_row(message), "content": None, "tool_calls": None, "reasoning": None}


def embedding_error_row(message: str) -> dict[str, Any]:
    """The row of an input that failed: no vector, ``error`` set."""
    return {"embedding": None, "tokens": 0, "error": message}

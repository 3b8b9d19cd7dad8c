"""The row a core's ``rows()`` gives for an input that failed, which a Ray Data job also writes in its place. Kept
apart from the cores so that a job's map actors import it without the engines."""

from __future__ import annotations

from typing import Any


def generation_error_row(message: str) -> dict[str, Any]:
    """The row of a prompt that failed: no text, ``error`` set."""
    return {"text": "", "prompt_tokens": 0, "output_tokens": 0, "finish_reason": "error", "error": message}


def embedding_error_row(message: str) -> dict[str, Any]:
    """The row of an input that failed: no vector, ``error`` set."""
    return {"embedding": None, "tokens": 0, "error": message}

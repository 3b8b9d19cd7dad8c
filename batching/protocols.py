"""Record protocols, function types and the ``Prompt`` record, as in the reference API (flyte.extras)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Protocol, TypeVar, runtime_checkable

RecordT = TypeVar("RecordT")
ResultT = TypeVar("ResultT")

ProcessFn = Callable[[list[RecordT]], Awaitable[list[ResultT]] | list[ResultT]]
"""``(batch) -> results`` in input order. ``async def`` runs on the event loop; a plain ``def`` runs in a
worker thread so a blocking ``model.generate`` never stalls the loop."""

InferenceFn = ProcessFn
"""Alias of :data:`ProcessFn` for LLM inference."""

CostEstimatorFn = Callable[[RecordT], int]
"""``(record) -> cost``: a non-negative integer (tokens, bytes, ...)."""

TokenEstimatorFn = CostEstimatorFn
"""Alias of :data:`CostEstimatorFn` for token counts."""


@runtime_checkable
class CostEstimator(Protocol):
    """A record that knows its own processing cost; used when ``submit`` gets no explicit cost."""

    def estimate_cost(self) -> int: ...


@runtime_checkable
class TokenEstimator(Protocol):
    """A record that knows its own token count; :class:`TokenBatcher` prefers it over ``estimate_cost``."""

    def estimate_tokens(self) -> int: ...


@dataclass
class Prompt:
    """A plain text prompt with the reference's rough token estimate (about 4 characters a token).

    >>> Prompt("What is 2+2?").estimate_tokens()
    4
    """

    text: str

    def estimate_tokens(self) -> int:
        """Rough token count: ``len(text) // 4 + 1``."""
        return len(self.text) // 4 + 1

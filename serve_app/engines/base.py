"""The one small interface every engine hides behind: a batch of requests in, results out, plus
tokenization (for token costs and context checks), abort, health and shutdown."""

from __future__ import annotations

import abc
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any


class EngineDeadError(RuntimeError):
    """The engine cannot serve any more requests; the replica's health check fails and Serve replaces it."""


@dataclass(frozen=True)
class SamplingOptions:
    """Per-request sampling, already validated."""

    max_tokens: int
    temperature: float = 0.0
    top_p: float = 1.0
    stop: tuple[str, ...] = ()
    seed: int | None = None


@dataclass
class GenerationRequest:
    """One prompt, tokenized, with its sampling and a unique request id (for aborts)."""

    request_id: str
    prompt_token_ids: list[int]
    sampling: SamplingOptions
    prompt_text: str = ""
    submitted_at: float = field(default_factory=time.monotonic)
    """When it passed validation (``time.monotonic``): the start of its queue wait."""

    def estimate_tokens(self) -> int:
        """Its KV-cache footprint: the prompt plus every token it may generate (the batcher's cost)."""
        return len(self.prompt_token_ids) + self.sampling.max_tokens


@dataclass
class GenerationResult:
    """One prompt's outcome; ``error`` is set (and ``finish_reason`` is "error") when it failed alone."""

    request_id: str
    text: str
    prompt_tokens: int
    output_tokens: int
    finish_reason: str
    error: str | None = None

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict."""
        return asdict(self)


class Engine(abc.ABC):
    """An inference engine behind the batcher. ``generate`` never blocks the event loop."""

    name: str = "engine"
    max_model_len: int

    @abc.abstractmethod
    def encode(self, text: str) -> list[int]:
        """Token ids of a plain prompt, as the engine will see it."""

    @abc.abstractmethod
    def encode_chat(self, messages: Sequence[dict[str, str]]) -> tuple[list[int], str]:
        """Token ids (and text) of chat messages with the model's chat template and generation prompt."""

    @abc.abstractmethod
    async def generate(self, batch: list[GenerationRequest]) -> list[GenerationResult]:
        """Run a batch; one result per request, in order. A request that fails alone gets an ``error``
        result; raise only when the whole batch failed (``EngineDeadError`` when the engine is gone)."""

    async def abort(self, request_id: str) -> None:  # noqa: B027 - optional hook, a no-op by default
        """Stop a request whose caller went away (its result is then discarded)."""

    def stats(self) -> dict[str, int]:
        """The engine's own counters (requests run, aborts received), shown in the replica's stats."""
        return {}

    @abc.abstractmethod
    async def check_health(self) -> None:
        """Raise if the engine cannot serve."""

    @abc.abstractmethod
    async def shutdown(self) -> None:
        """Release the engine's processes and memory."""

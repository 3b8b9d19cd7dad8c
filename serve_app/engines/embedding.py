"""The one small interface both embedding engines hide behind: tokenize off the event loop, truncate, embed a
list of tokenized inputs (one vector each, in order), health, statistics, shutdown. ``vllm`` (vLLM's pooling
runner, :mod:`.pooling`) embeds each input as it is admitted; ``padded`` (sentence-transformers, :mod:`.encoder`)
embeds whole padded batches. The embedding core (``serve_app.core.Embedder``) picks the batcher each one wants."""

from __future__ import annotations

import abc
import asyncio
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from ..config import EmbeddingConfig


@dataclass
class EmbeddingRequest:
    """One input, tokenized (special tokens included), with a unique id."""

    request_id: str
    token_ids: list[int]
    submitted_at: float = field(default_factory=time.monotonic)
    """When it passed validation (``time.monotonic``): the start of its queue wait."""

    def estimate_tokens(self) -> int:
        """Its cost: the tokens the encoder reads (a padded batch is padded to the longest of them)."""
        return len(self.token_ids)


class EmbeddingEngine(abc.ABC):
    """An embedding model behind the batcher; nothing here blocks the event loop.

    ``continuous``: the engine batches by itself (vLLM), so the core admits inputs one by one under a token budget;
    otherwise it runs what it is given as one padded batch (``padded``), and the core cuts batches by length.
    """

    name: str = "embedding"
    continuous: bool = False
    padded: bool = True
    device: str = "cpu"
    dtype: str = "float32"
    """What the model computes in (``auto`` resolved)."""
    dimensions: int
    vocab_size: int
    max_length: int
    """The longest input the model reads, in tokens (also :attr:`max_model_len`)."""
    special_ids: frozenset[int] = frozenset()

    @property
    def max_model_len(self) -> int:
        """The longest input, as ``/v1/models`` shows it."""
        return self.max_length

    @abc.abstractmethod
    async def tokenize(self, texts: Sequence[str]) -> list[list[int]]:
        """Token ids of each text with the model's special tokens, untruncated (the caller checks length)."""

    @abc.abstractmethod
    async def embed(self, batch: list[EmbeddingRequest]) -> list[list[float]]:
        """One vector per request, in order (normalised as the model prescribes). Raises when the batch failed;
        cancelling it abandons (and, where the engine can, aborts) what is still running."""

    def truncate(self, token_ids: list[int], limit: int) -> list[int]:
        """The first ``limit`` tokens, keeping the closing special token (as the tokenizer's truncation does)."""
        if len(token_ids) <= limit:
            return token_ids
        last = token_ids[-1]
        if last in self.special_ids and limit > 1:
            return [*token_ids[: limit - 1], last]
        return token_ids[:limit]

    def inflight_tokens(self) -> int | None:
        """Input tokens worth holding inside a continuous engine at once (sizes an ``auto`` in-flight budget)."""
        return None

    def max_running(self) -> int | None:
        """How many inputs a continuous engine runs at once (sizes an ``auto`` ``max_inflight``)."""
        return None

    def stats(self) -> dict[str, Any]:
        """The engine's own counters, shown in the replica's stats."""
        return {}

    @abc.abstractmethod
    async def check_health(self) -> None:
        """Raise if the engine cannot serve."""

    def close(self) -> None:  # noqa: B027 - nothing to release by default
        """Release the engine's threads, processes and memory (idempotent, from any thread)."""

    async def shutdown(self) -> None:
        """Release the engine after a replica's drain (without blocking the event loop)."""
        await asyncio.to_thread(self.close)


def build_embedding_engine(config: EmbeddingConfig) -> EmbeddingEngine:
    """The engine ``config.engine`` selects (vLLM and torch are imported only when chosen)."""
    if config.engine == "padded":
        from .encoder import EncoderEngine

        return EncoderEngine(config.model, config.device, config.cpu_threads, config.dtype)
    from .pooling import PoolingEngine

    return PoolingEngine(config.model, config.vllm, config.model_name)

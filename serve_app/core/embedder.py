"""One encoder behind one batcher: inputs -> validation -> batcher (batch mode, length-aware, a padded-token
budget) -> encoder -> vectors. The Serve replica and the in-process Ray Data actors both embed through it.

    embedder = Embedder(EmbeddingConfig())
    await embedder.start()
    vectors = await embedder.vectors(["a text", "another"])       # raises ValueError on bad input
    rows = await embedder.rows(["a text", ""])                     # per-row errors instead
    await embedder.stop()
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from typing import Any

from batching import QueueFullError, TokenBatcher

from ..engines.encoder import EmbeddingRequest, EncoderEngine
from ..metrics import ReplicaMetrics
from ..validation import RequestError
from .config import EmbeddingConfig
from .protocol import EmbeddingInputs


class EmbeddingFailedError(RuntimeError):
    """The encoder failed on an input (its batch failed); the replica stays up (HTTP 500)."""


class Embedder:
    """An encoder and its batcher; ``metrics`` (a replica's) records each batch and each refusal."""

    def __init__(self, config: EmbeddingConfig, metrics: ReplicaMetrics | None = None) -> None:
        self.config = config
        self.engine = EncoderEngine(config.model, config.device, config.cpu_threads, config.dtype)
        self.inputs = EmbeddingInputs(self.engine, config)
        self.metrics = metrics
        self.batcher = TokenBatcher(self._process, **config.batcher.batcher_kwargs(self.engine.device))

    async def start(self) -> None:
        """Start the batcher on the running event loop."""
        await self.batcher.start()

    async def stop(self, timeout: float | None = None) -> None:
        """Finish what is queued, then release the encoder."""
        await self.batcher.stop(timeout=timeout)
        await self.engine.shutdown()

    async def _process(self, batch: list[EmbeddingRequest]) -> list[list[float]]:
        if self.metrics is not None:
            now = time.monotonic()
            padded = len(batch) * max(r.estimate_tokens() for r in batch)
            self.metrics.observe_batch(len(batch), padded, [now - r.submitted_at for r in batch])
        return await self.engine.embed(batch)

    async def run(self, requests: list[EmbeddingRequest]) -> list[list[float] | BaseException]:
        """Queue the requests, all or none (a full queue raises :class:`~batching.QueueFullError` at once),
        and return each one's vector or its own failure, in order. A caller that goes away (or waits past
        ``request_timeout_s``) withdraws what is still queued."""
        try:
            futures = self.batcher.submit_batch_nowait(requests)
        except QueueFullError:
            if self.metrics is not None:
                self.metrics.rejected.inc(len(requests))
            raise
        try:
            gathered = asyncio.gather(*futures, return_exceptions=True)
            return await asyncio.wait_for(gathered, self.config.request_timeout_s)
        finally:
            for future in futures:
                future.cancel()  # no-op once done; otherwise the batcher drops it before the encoder

    async def vectors(self, inputs: Sequence[Any], truncate: int | None = None) -> list[list[float]]:
        """One vector per input (text or token ids), in order; ``ValueError`` names the first bad input."""
        return self.check(await self.run(self.inputs.requests(inputs, truncate)))

    @staticmethod
    def check(outcomes: list[list[float] | BaseException]) -> list[list[float]]:
        """The vectors, or the first input's failure (a request fails whole when one of its inputs does)."""
        for index, outcome in enumerate(outcomes):
            if isinstance(outcome, BaseException):
                raise EmbeddingFailedError(f"input {index} failed in the encoder: {outcome}") from outcome
        return outcomes  # type: ignore[return-value]

    async def rows(self, texts: Sequence[Any], truncate: int | None = None) -> list[dict[str, Any]]:
        """One dict per text (``embedding``, ``tokens``, ``error``): a bad or failed text fails alone."""
        rows: list[dict[str, Any]] = [{} for _ in texts]
        requests, slots = [], []
        for index, text in enumerate(texts):
            try:
                requests.append(self.inputs.one(index, text, truncate))
                slots.append(index)
            except RequestError as exc:
                rows[index] = {"embedding": None, "tokens": 0, "error": f"invalid: {exc}"}
        outcomes = await self.run(requests) if requests else []
        for index, request, outcome in zip(slots, requests, outcomes):
            failed = isinstance(outcome, BaseException)
            rows[index] = {
                "embedding": None if failed else outcome,
                "tokens": len(request.token_ids),
                "error": f"{type(outcome).__name__}: {outcome}" if failed else None,
            }
        return rows

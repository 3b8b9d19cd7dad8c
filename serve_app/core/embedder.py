"""The embedding core: one engine (``vllm`` or ``padded``), the batcher it wants (continuous admission under an
input-token budget for vLLM, which packs inputs itself; padded batches cut by length for the padded engine) and
input building, and the one path every embedding request takes (:meth:`Embedder.run`), whoever sends it: a Serve
replica's HTTP route and handle methods, or a Ray Data actor in process. It reads as the generation core does.

    embedder = Embedder(EmbeddingConfig())
    await embedder.start()
    vectors = await embedder.vectors(["a text", "another"])       # RequestError (a ValueError) on bad input
    rows = await embedder.rows(["a text", ""])                     # per-row errors instead
    await embedder.stop()
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

from batching import ContinuousBatcher, TokenBatcher

from ..config import BatcherSettings, EmbeddingConfig
from ..engines.embedding import EmbeddingRequest, build_embedding_engine
from ..errors import GenerationError
from .base import Core, Observer
from .inputs import InputBuilder
from .rows import answer_rows, embedding_error_row

Outcome = list[float] | BaseException


def check(outcomes: Sequence[Outcome]) -> list[list[float]]:
    """The vectors, or :class:`~serve_app.errors.GenerationError` for the first input that failed."""
    for index, outcome in enumerate(outcomes):
        if isinstance(outcome, BaseException):
            raise GenerationError(f"input {index} failed in the encoder: {outcome}") from outcome
    return list(outcomes)  # type: ignore[arg-type]


class Embedder(Core[EmbeddingConfig, BatcherSettings]):
    """The embedding core (see the module's docstring)."""

    def __init__(self, config: EmbeddingConfig, observer: Observer | None = None) -> None:
        engine = build_embedding_engine(config)
        self.inputs = InputBuilder(engine, config)
        super().__init__(config, engine, observer)

    def _new_batcher(self, settings: BatcherSettings) -> TokenBatcher | ContinuousBatcher:
        """``settings.mode``'s batcher; ``auto`` sizes come from the engine (its padded batch budget on its device,
        or what a continuous engine holds at once)."""
        engine = self.engine
        if settings.mode == "continuous":
            kwargs = settings.batcher_kwargs(engine.inflight_tokens(), engine.max_running())
            self.budget = kwargs["max_inflight_cost"]
            return ContinuousBatcher(self._process_one, **kwargs)
        config = self.config
        kwargs = settings.batcher_kwargs(
            config.batch_tokens(engine.device), engine.padded, config.batch_overhead(engine.device)
        )
        self.budget = kwargs["target_batch_tokens"] * kwargs["max_concurrent_batches"]
        return TokenBatcher(self._process, **kwargs)

    async def _process(self, batch: list[EmbeddingRequest]) -> list[list[float]]:
        """Batch mode: one batch into the engine."""
        self._started(batch, batch=True)
        return await self.engine.embed(batch)

    async def _process_one(self, request: EmbeddingRequest) -> list[float]:
        """Continuous mode: one admitted input into the engine (cancelled when its caller goes away)."""
        self._started([request], batch=False)
        (vector,) = await self.engine.embed([request])
        return vector

    # -- The one path --------------------------------------------------------------------------------------

    async def run(self, requests: list[EmbeddingRequest]) -> list[Outcome]:
        """Queue ``requests``, all or none (a full queue raises :class:`~batching.QueueFullError` at once), and
        return each one's vector or its own failure, in order. A caller that goes away (or waits past
        ``request_timeout_s``) withdraws what is still queued and aborts what a continuous engine is running."""
        futures = self._queue(self.batcher.submit_batch_nowait, requests)
        with self._holding(len(requests)) as finished:
            gathered = asyncio.gather(*futures, return_exceptions=True)
            try:
                outcomes = await asyncio.wait_for(gathered, self.config.request_timeout_s)
            except asyncio.TimeoutError:
                raise TimeoutError(f"not finished within request_timeout_s={self.config.request_timeout_s:g}") from None
            finally:
                for future in futures:
                    future.cancel()  # no-op once done; otherwise withdrawn, or aborted in the engine
                if gathered.done() and not gathered.cancelled():
                    gathered.exception()  # a cancelled gather holds a CancelledError: retrieved, not logged
            finished[0] = len(requests)
        return outcomes

    async def vectors(self, inputs: Sequence[Any], truncate: int | None = None) -> list[list[float]]:
        """One vector per input (text or token ids), in order; :class:`RequestError` names the first bad input,
        :class:`GenerationError` the first that failed."""
        return check(await self.run(await self.inputs.requests(inputs, truncate)))

    async def rows(self, texts: Sequence[Any], truncate: int | None = None) -> list[dict[str, Any]]:
        """One dict per input (``embedding``, ``tokens``, ``error``): a bad or failed input fails alone."""

        def answer(request: EmbeddingRequest, outcome: Any) -> dict[str, Any]:
            failed = isinstance(outcome, BaseException)
            return {
                "embedding": None if failed else outcome,
                "tokens": len(request.token_ids),
                "error": f"{type(outcome).__name__}: {outcome}" if failed else None,
            }

        return await answer_rows(await self.inputs.rows(texts, truncate), self.run, answer, embedding_error_row)

    def stats(self) -> dict[str, Any]:
        """The core's statistics, with the engine's device, what it computes in and the vectors' dimensions."""
        engine = self.engine
        return {**super().stats(), "device": engine.device, "dtype": engine.dtype, "dimensions": engine.dimensions}

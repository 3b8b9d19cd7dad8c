"""The replica's batcher for its mode: continuous admission over the engine's per-request streams, or
budgeted batches for a static-batch engine. One construction for the server and in-process Ray Data actors."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Awaitable, Callable

from batching import ContinuousBatcher, TokenBatcher

from .config import BatcherSettings
from .engines import Engine, GenerationOutput, GenerationRequest, GenerationResult, progress

logger = logging.getLogger(__name__)

BatchFn = Callable[[list[GenerationRequest]], Awaitable[list[GenerationResult]]]
StreamFn = Callable[[GenerationRequest], AsyncIterator[GenerationOutput]]


def build_batcher(
    settings: BatcherSettings, engine: Engine, batch_fn: BatchFn | None = None, stream_fn: StreamFn | None = None
) -> TokenBatcher | ContinuousBatcher:
    """``settings.mode``'s batcher in front of ``engine`` (``batch_fn``/``stream_fn`` wrap the engine's own
    ``generate``/``stream``); ``auto`` sizes the in-flight budget from the engine's KV cache and the in-flight
    request cap from the number of requests it runs at once."""
    kwargs = settings.batcher_kwargs(engine.kv_cache_tokens(), engine.max_running())
    logger.info("%s batcher: %s", settings.mode, kwargs)
    if settings.mode == "batch":
        return TokenBatcher(batch_fn or engine.generate, **kwargs)
    return ContinuousBatcher(stream_fn or engine.stream, progress_fn=progress, **kwargs)

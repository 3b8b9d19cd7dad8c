"""``TokenBatcher``: the LLM-flavoured face of :class:`DynamicBatcher`, with token-named parameters."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

from .batcher import DynamicBatcher
from .protocols import CostEstimatorFn, ProcessFn, RecordT, ResultT

__all__ = ["TokenBatcher"]


class TokenBatcher(DynamicBatcher[RecordT, ResultT]):
    """Token-budgeted batcher for LLM inference.

    It maps ``inference_fn``, ``token_estimator``, ``target_batch_tokens`` and ``default_token_estimate``
    onto the :class:`DynamicBatcher` parameters and asks records for ``estimate_tokens()`` before
    ``estimate_cost()``. Every other keyword (``max_concurrent_batches``, ``length_aware``, ...) passes
    through. Example::

        async def inference(batch: list[Prompt]) -> list[str]:
            return [await generate(p.text) for p in batch]

        async with TokenBatcher[Prompt, str](inference_fn=inference, target_batch_tokens=8_192) as batcher:
            answer = await (await batcher.submit(Prompt("What is 2+2?")))
    """

    _cost_methods = ("estimate_tokens", "estimate_cost")

    def __init__(
        self,
        inference_fn: ProcessFn[RecordT, ResultT] | None = None,
        *,
        process_fn: ProcessFn[RecordT, ResultT] | None = None,
        token_estimator: CostEstimatorFn[RecordT] | None = None,
        cost_estimator: CostEstimatorFn[RecordT] | None = None,
        target_batch_tokens: int | None = None,
        target_batch_cost: int = 32_000,
        default_token_estimate: int | None = None,
        default_cost: int = 1,
        max_batch_size: int = 256,
        min_batch_size: int = 1,
        batch_timeout_s: float = 0.05,
        max_queue_size: int = 5_000,
        prefetch_batches: int = 2,
        **options: Any,
    ) -> None:
        fn = inference_fn if inference_fn is not None else process_fn
        if fn is None:
            raise TypeError("TokenBatcher requires either 'inference_fn' or 'process_fn'")
        super().__init__(
            fn,
            cost_estimator=token_estimator if token_estimator is not None else cost_estimator,
            target_batch_cost=target_batch_tokens if target_batch_tokens is not None else target_batch_cost,
            default_cost=default_token_estimate if default_token_estimate is not None else default_cost,
            max_batch_size=max_batch_size,
            min_batch_size=min_batch_size,
            batch_timeout_s=batch_timeout_s,
            max_queue_size=max_queue_size,
            prefetch_batches=prefetch_batches,
            **options,
        )

    async def submit(
        self,
        record: RecordT,
        *,
        estimated_tokens: int | None = None,
        estimated_cost: int | None = None,
    ) -> asyncio.Future[ResultT]:
        """Queue one record; ``estimated_tokens`` (or ``estimated_cost``) overrides its own estimate."""
        return await super().submit(
            record, estimated_cost=estimated_tokens if estimated_tokens is not None else estimated_cost
        )

    def submit_nowait(
        self,
        record: RecordT,
        *,
        estimated_tokens: int | None = None,
        estimated_cost: int | None = None,
    ) -> asyncio.Future[ResultT]:
        """Like :meth:`submit` but raises :class:`~batching.QueueFullError` instead of waiting."""
        return super().submit_nowait(
            record, estimated_cost=estimated_tokens if estimated_tokens is not None else estimated_cost
        )

    async def submit_batch(
        self,
        records: Sequence[RecordT],
        *,
        estimated_cost: Sequence[int] | None = None,
        estimated_tokens: Sequence[int] | None = None,
    ) -> list[asyncio.Future[ResultT]]:
        """Queue several records; ``estimated_tokens`` (or ``estimated_cost``) gives one count each."""
        return await super().submit_batch(
            records, estimated_cost=estimated_tokens if estimated_tokens is not None else estimated_cost
        )

    def submit_batch_nowait(
        self,
        records: Sequence[RecordT],
        *,
        estimated_cost: Sequence[int] | None = None,
        estimated_tokens: Sequence[int] | None = None,
    ) -> list[asyncio.Future[ResultT]]:
        """All-or-nothing :meth:`submit_batch` that raises :class:`~batching.QueueFullError` if full."""
        return super().submit_batch_nowait(
            records, estimated_cost=estimated_tokens if estimated_tokens is not None else estimated_cost
        )

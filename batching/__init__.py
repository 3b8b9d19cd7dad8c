"""Token-aware dynamic batching for asyncio: many producers, one model, batches under a cost budget.

A drop-in for ``flyte.extras``' batcher API (change only the import)::

    from batching import DynamicBatcher, TokenBatcher, Prompt, BatchStats

Standard library only; ``batching.estimators.HFTokenCounter`` optionally uses ``transformers``.
"""

from .batcher import DynamicBatcher
from .errors import BatchCancelledError, BatcherError, BatcherStoppedError, QueueFullError
from .protocols import (
    CostEstimator,
    CostEstimatorFn,
    InferenceFn,
    ProcessFn,
    Prompt,
    TokenEstimator,
    TokenEstimatorFn,
)
from .stats import BatchStats
from .token_batcher import TokenBatcher

__all__ = [
    "BatchCancelledError",
    "BatchStats",
    "BatcherError",
    "BatcherStoppedError",
    "CostEstimator",
    "CostEstimatorFn",
    "DynamicBatcher",
    "InferenceFn",
    "ProcessFn",
    "Prompt",
    "QueueFullError",
    "TokenBatcher",
    "TokenEstimator",
    "TokenEstimatorFn",
]

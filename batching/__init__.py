"""Token-aware dynamic batching for asyncio: many producers, one model, batches under a cost budget.

A drop-in for ``flyte.extras``' batcher API (change only the import)::

    from batching import DynamicBatcher, TokenBatcher, Prompt, BatchStats

Two modes: *batch* (:class:`DynamicBatcher` / :class:`TokenBatcher`) cuts budgeted batches for engines that
run static, padded batches; *continuous* (:class:`ContinuousBatcher`) admits records one by one under an
in-flight budget and streams each record's outputs, for engines that batch continuously (vLLM), by priority
(with aging, a share cap for lower priorities and fair share between tenants). Their statistics:
:class:`BatchStats` (batches) and :class:`AdmissionStats` (admissions); both estimate the wait behind their
queue (``expected_wait``), which every :class:`QueueFullError` carries as ``retry_after_s``.

Standard library only; ``batching.estimators.HFTokenCounter`` optionally uses ``transformers``.
"""

from .batcher import DynamicBatcher
from .continuous import ContinuousBatcher
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
from .record_stream import RecordStream
from .stats import AdmissionStats, BatchStats
from .tickets import peak_cost
from .token_batcher import TokenBatcher

__all__ = [
    "AdmissionStats",
    "BatchCancelledError",
    "BatchStats",
    "BatcherError",
    "BatcherStoppedError",
    "ContinuousBatcher",
    "CostEstimator",
    "CostEstimatorFn",
    "DynamicBatcher",
    "InferenceFn",
    "ProcessFn",
    "Prompt",
    "QueueFullError",
    "RecordStream",
    "TokenBatcher",
    "TokenEstimator",
    "TokenEstimatorFn",
    "peak_cost",
]

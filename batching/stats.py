"""Statistics snapshots (``batcher.stats``): :class:`BatchStats` for batch mode (the reference's fields plus
latency percentiles, queue state and padding waste), :class:`AdmissionStats` for continuous mode. The
counters behind them live in :mod:`batching.recorders`."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any

__all__ = ["AdmissionStats", "BatchStats", "percentile"]


def percentile(sorted_values: list[float], q: float) -> float:
    """Nearest-rank percentile ``q`` (0-100) of an ascending list: the smallest value with at least ``q``%
    of the list at or below it; 0.0 when it is empty. (``q * n / 100`` rather than ``q / 100 * n``, and the
    tolerance, keep a whole-number rank such as 7 of 100 from becoming 8 through float rounding.)"""
    if not sorted_values:
        return 0.0
    n = len(sorted_values)
    rank = max(1, min(n, math.ceil(q * n / 100 - 1e-9)))
    return sorted_values[rank - 1]


class _Snapshot:
    """``utilization`` and ``to_dict()``, for the snapshot dataclasses."""

    busy_time_s: float
    idle_time_s: float

    @property
    def utilization(self) -> float:
        """Fraction of running time with work inside ``process_fn`` (0.0-1.0)."""
        total = self.busy_time_s + self.idle_time_s
        return self.busy_time_s / total if total > 0 else 0.0

    def to_dict(self) -> dict[str, Any]:
        """A plain ``dict`` of every field plus ``utilization``, for JSON and metrics export. Per-priority
        and per-tenant fields become dicts with string keys (``{"0": 120}``), as JSON writes them: the dict is the same
        after a JSON round trip."""
        data = asdict(self)  # type: ignore[call-overload]
        for name, value in data.items():
            if isinstance(value, dict):
                data[name] = {str(key): item for key, item in value.items()}
        data["utilization"] = self.utilization
        return data


@dataclass
class BatchStats(_Snapshot):
    """A snapshot of a batch-mode batcher's statistics (:class:`~batching.DynamicBatcher`'s ``stats``).

    The first eight fields are the reference's. ``total_completed`` counts records that went through
    ``process_fn`` (their futures resolved with a result or an error); ``total_failed`` is the part of those
    that got an error; ``total_cancelled`` counts records whose caller cancelled them before their batch
    started (never processed). Once the batcher is idle:
    ``total_submitted == total_completed + total_cancelled``. ``utilization`` is the fraction of running
    time with at least one batch inside ``process_fn``.

    ``in_flight_cost``, ``budget``, ``budget_occupancy``, ``mean_budget_occupancy`` and the
    ``first_output_*`` percentiles are kept for compatibility and stay 0 in batch mode; the continuous
    batcher reports them in :class:`AdmissionStats`.
    """

    total_submitted: int = 0
    total_completed: int = 0
    total_batches: int = 0
    total_batch_cost: int = 0
    avg_batch_size: float = 0.0
    avg_batch_cost: float = 0.0
    busy_time_s: float = 0.0
    idle_time_s: float = 0.0
    total_failed: int = 0
    total_cancelled: int = 0
    total_oversized: int = 0
    queue_depth: int = 0
    queued_cost: int = 0
    in_flight: int = 0
    padding_waste: float = 0.0
    queue_wait_p50_s: float = 0.0
    queue_wait_p95_s: float = 0.0
    queue_wait_p99_s: float = 0.0
    latency_p50_s: float = 0.0
    latency_p95_s: float = 0.0
    latency_p99_s: float = 0.0
    in_flight_cost: int = 0
    budget: int = 0
    budget_occupancy: float = 0.0
    mean_budget_occupancy: float = 0.0
    first_output_p50_s: float = 0.0
    first_output_p95_s: float = 0.0
    first_output_p99_s: float = 0.0


@dataclass
class AdmissionStats(_Snapshot):
    """A snapshot of a continuous batcher's statistics (:class:`~batching.ContinuousBatcher`'s ``stats``).

    Records are admitted into ``process_fn`` one by one, so there are no batches: ``total_admitted`` counts
    records that entered ``process_fn`` and ``total_admitted_cost`` sums their costs. ``total_completed``
    counts records that ended with their result or an error after running (``total_failed`` is the part
    with an error); ``total_cancelled`` counts records withdrawn while queued or running. Once the batcher
    is idle: ``total_submitted == total_completed + total_cancelled``.

    ``budget_occupancy`` is ``in_flight_cost / budget`` now, ``mean_budget_occupancy`` its average over the
    running time. ``mean_in_flight`` averages the number of records in flight over the time at least one
    was (``busy_time_s``): the continuous analogue of a batch size (``mean_in_flight * utilization`` is the
    average over all the running time). ``utilization`` is the fraction of running time with at least one
    record in flight. Queue waits run from submission to admission, latencies from submission to the
    record's end, first outputs from submission to its first output.

    Per priority (lower runs first), ascending: ``tokens_by_priority`` is the queued plus in-flight cost of
    each priority with anything queued or in flight (a router's view of the load by class of work);
    ``in_flight_by_priority`` the in-flight cost of each priority with a record in flight. Both are empty
    when idle; ``to_dict()`` writes their keys as strings.

    Per tenant (``tenant_fn`` or ``record.tenant``; None is the shared tenant): ``admitted_cost_by_tenant``
    the cost admitted so far for each tenant (what fair share evens out; the 1,024 most recently admitted),
    ``queued_by_tenant`` the records each tenant has queued now (only tenants with any). ``to_dict()``
    writes their keys as ``str(tenant)``.
    """

    total_submitted: int = 0
    total_admitted: int = 0
    total_completed: int = 0
    total_failed: int = 0
    total_cancelled: int = 0
    total_admitted_cost: int = 0
    queue_depth: int = 0
    queued_cost: int = 0
    in_flight: int = 0
    in_flight_cost: int = 0
    budget: int = 0
    budget_occupancy: float = 0.0
    mean_budget_occupancy: float = 0.0
    mean_in_flight: float = 0.0
    busy_time_s: float = 0.0
    idle_time_s: float = 0.0
    queue_wait_p50_s: float = 0.0
    queue_wait_p95_s: float = 0.0
    queue_wait_p99_s: float = 0.0
    latency_p50_s: float = 0.0
    latency_p95_s: float = 0.0
    latency_p99_s: float = 0.0
    first_output_p50_s: float = 0.0
    first_output_p95_s: float = 0.0
    first_output_p99_s: float = 0.0
    tokens_by_priority: dict[int, int] = field(default_factory=dict)
    in_flight_by_priority: dict[int, int] = field(default_factory=dict)
    admitted_cost_by_tenant: dict[Any, int] = field(default_factory=dict)
    queued_by_tenant: dict[Any, int] = field(default_factory=dict)

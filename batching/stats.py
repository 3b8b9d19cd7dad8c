"""Batcher statistics: the reference's ``BatchStats`` fields plus latency percentiles, queue state and
padding waste, and the recorder that the batcher updates once per batch (not once per record)."""

from __future__ import annotations

import math
import time
from collections import deque
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from typing import Any

__all__ = ["BatchStats", "StatsRecorder", "percentile"]


def percentile(sorted_values: list[float], q: float) -> float:
    """Nearest-rank percentile ``q`` (0-100) of an ascending list: the smallest value with at least ``q``%
    of the list at or below it; 0.0 when it is empty. (``q * n / 100`` rather than ``q / 100 * n``, and the
    tolerance, keep a whole-number rank such as 7 of 100 from becoming 8 through float rounding.)"""
    if not sorted_values:
        return 0.0
    n = len(sorted_values)
    rank = max(1, min(n, math.ceil(q * n / 100 - 1e-9)))
    return sorted_values[rank - 1]


@dataclass
class BatchStats:
    """A snapshot of a batcher's statistics (``batcher.stats``).

    The first eight fields are the reference's. ``total_completed`` counts records that went through
    ``process_fn`` (their futures resolved with a result or an error); ``total_failed`` is the part of those
    that got an error; ``total_cancelled`` counts records whose caller cancelled them before their batch
    started (never processed). Once the batcher is idle:
    ``total_submitted == total_completed + total_cancelled``.

    The continuous batcher (:class:`~batching.ContinuousBatcher`) counts each admitted record as a batch of
    one and fills the admission fields: ``in_flight_cost`` of ``budget`` now, ``budget_occupancy`` (their
    ratio) and its time average ``mean_budget_occupancy``, and time to first output percentiles (from
    submission to the record's first streamed output). There, ``total_cancelled`` also counts records
    withdrawn while they ran.
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

    @property
    def utilization(self) -> float:
        """Fraction of running time with at least one batch inside ``process_fn`` (0.0-1.0)."""
        total = self.busy_time_s + self.idle_time_s
        return self.busy_time_s / total if total > 0 else 0.0

    def to_dict(self) -> dict[str, Any]:
        """A plain ``dict`` of every field plus ``utilization``, for JSON and metrics export."""
        data = asdict(self)
        data["utilization"] = self.utilization
        return data


class StatsRecorder:
    """Mutable counters behind :class:`BatchStats`; the batcher calls it once per batch."""

    def __init__(self, latency_samples: int = 10_000) -> None:
        self.completed = 0
        self.failed = 0
        self.cancelled = 0
        self.batches = 0
        self.batch_records = 0
        self.batch_cost = 0
        self.oversized = 0
        self.padding_sum = 0.0
        self.queue_waits: deque[float] = deque(maxlen=latency_samples)
        self.latencies: deque[float] = deque(maxlen=latency_samples)
        self.first_outputs: deque[float] = deque(maxlen=latency_samples)
        self._occupancy = 0.0
        self._occupancy_area = 0.0
        self._occupancy_since = time.monotonic()
        self._started_at: float | None = None
        self._stopped_at: float | None = None
        self._busy = 0.0
        self._active = 0
        self._active_since = 0.0

    def start(self) -> None:
        """Start (or restart) the running clock that utilization is measured against."""
        now = time.monotonic()
        if self._started_at is None:
            self._started_at = now
        elif self._stopped_at is not None:  # restarted: do not count the stopped gap as idle
            self._started_at += now - self._stopped_at
        self._stopped_at = None

    def stop(self) -> None:
        """Freeze the running clock."""
        self._stopped_at = time.monotonic()

    def batch_started(self, costs: list[int], now: float, enqueued_at: Iterable[float]) -> None:
        """Count a batch entering ``process_fn`` at ``now``: its records' costs and enqueue times."""
        total = sum(costs)
        largest = max(costs)
        self.batches += 1
        self.batch_records += len(costs)
        self.batch_cost += total
        if largest > 0:
            self.padding_sum += 1.0 - total / (len(costs) * largest)
        self.queue_waits.extend([now - t for t in enqueued_at])
        if self._active == 0:
            self._active_since = time.monotonic()
        self._active += 1

    def batch_finished(self, completed: int, failed: int, now: float, enqueued_at: Iterable[float]) -> None:
        """Count a batch leaving ``process_fn`` at ``now``: records resolved, failed, and enqueue times."""
        self.completed += completed
        self.failed += failed
        self.latencies.extend([now - t for t in enqueued_at])
        self._active -= 1
        if self._active == 0:
            self._busy += time.monotonic() - self._active_since

    # -- Continuous admission: one record at a time -------------------------------------------------------

    def _occupancy_to(self, occupancy: float) -> None:
        now = time.monotonic()
        if self._stopped_at is None:
            self._occupancy_area += self._occupancy * (now - self._occupancy_since)
        self._occupancy_since = now
        self._occupancy = occupancy

    def admitted(self, cost: int, waited: float, occupancy: float) -> None:
        """Count a record admitted after ``waited`` seconds; ``occupancy``: in-flight cost / budget now."""
        self.batches += 1
        self.batch_records += 1
        self.batch_cost += cost
        self.queue_waits.append(waited)
        if self._active == 0:
            self._active_since = time.monotonic()
        self._active += 1
        self._occupancy_to(occupancy)

    def released(self, occupancy: float) -> None:
        """Count a record leaving the engine (finished, failed or withdrawn)."""
        self._active -= 1
        if self._active == 0:
            self._busy += time.monotonic() - self._active_since
        self._occupancy_to(occupancy)

    def record_finished(self, failed: bool, latency: float) -> None:
        """Count a record whose future or stream ended with its result (or its error)."""
        self.completed += 1
        self.failed += failed
        self.latencies.append(latency)

    def first_output(self, seconds: float) -> None:
        """Count a record's first streamed output, ``seconds`` after it was submitted."""
        self.first_outputs.append(seconds)

    def snapshot(
        self,
        queue_depth: int,
        queued_cost: int,
        in_flight: int,
        in_flight_cost: int = 0,
        budget: int = 0,
        submitted: int | None = None,
    ) -> BatchStats:
        """Build a :class:`BatchStats` from the counters and the batcher's current queue state."""
        now = time.monotonic()
        end = self._stopped_at if self._stopped_at is not None else now
        busy = self._busy + (now - self._active_since if self._active else 0.0)
        elapsed = end - self._started_at if self._started_at is not None else 0.0
        waits = sorted(self.queue_waits)
        lat = sorted(self.latencies)
        first = sorted(self.first_outputs)
        batches = self.batches
        area = self._occupancy_area
        if self._stopped_at is None:
            area += self._occupancy * (now - self._occupancy_since)
        return BatchStats(
            total_submitted=submitted
            if submitted is not None
            else self.completed + self.cancelled + queue_depth + in_flight,
            total_completed=self.completed,
            total_batches=batches,
            total_batch_cost=self.batch_cost,
            avg_batch_size=self.batch_records / batches if batches else 0.0,
            avg_batch_cost=self.batch_cost / batches if batches else 0.0,
            busy_time_s=busy,
            idle_time_s=max(0.0, elapsed - busy),
            total_failed=self.failed,
            total_cancelled=self.cancelled,
            total_oversized=self.oversized,
            queue_depth=queue_depth,
            queued_cost=queued_cost,
            in_flight=in_flight,
            padding_waste=self.padding_sum / batches if batches else 0.0,
            queue_wait_p50_s=percentile(waits, 50),
            queue_wait_p95_s=percentile(waits, 95),
            queue_wait_p99_s=percentile(waits, 99),
            latency_p50_s=percentile(lat, 50),
            latency_p95_s=percentile(lat, 95),
            latency_p99_s=percentile(lat, 99),
            in_flight_cost=in_flight_cost,
            budget=budget,
            budget_occupancy=in_flight_cost / budget if budget else 0.0,
            mean_budget_occupancy=area / elapsed if elapsed > 0 else 0.0,
            first_output_p50_s=percentile(first, 50),
            first_output_p95_s=percentile(first, 95),
            first_output_p99_s=percentile(first, 99),
        )

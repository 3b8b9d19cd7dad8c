"""The mutable counters behind the statistics snapshots: :class:`Recorder` holds what both modes measure
(outcomes, the running clock, busy time, queue waits and latencies); :class:`BatchRecorder` adds batches
(:class:`~batching.BatchStats`), :class:`AdmissionRecorder` admissions (:class:`~batching.AdmissionStats`).
The batchers call them once per batch or per record state change, never per output."""

from __future__ import annotations

import time
from collections import OrderedDict, deque
from collections.abc import Iterable
from typing import Any

from .stats import AdmissionStats, BatchStats, percentile

__all__ = ["TENANTS_KEPT", "AdmissionRecorder", "BatchRecorder", "Recorder"]

TENANTS_KEPT = 1_024
"""Tenants whose admitted cost the statistics keep, the most recently admitted: one per request (a unique
``user`` on every call) must not grow a long-lived replica's memory without bound."""


def percentiles(name: str, values: Iterable[float]) -> dict[str, float]:
    """``{name}_p50_s``, ``_p95_s`` and ``_p99_s`` of ``values`` (nearest rank; 0.0 when empty)."""
    ordered = sorted(values)
    return {f"{name}_p{q}_s": percentile(ordered, q) for q in (50, 95, 99)}


class Recorder:
    """Outcomes, the running clock (``start``/``stop``), busy time and the recent queue waits and latencies.

    Busy time is the running time with at least one unit of work active (a batch inside ``process_fn``, or
    a record in flight); the rest of the running time is idle.
    """

    def __init__(self, latency_samples: int = 10_000) -> None:
        self.completed = 0
        self.failed = 0
        self.cancelled = 0
        self.queue_waits: deque[float] = deque(maxlen=latency_samples)
        self.latencies: deque[float] = deque(maxlen=latency_samples)
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

    @property
    def running(self) -> bool:
        return self._stopped_at is None

    def _enter(self, now: float) -> None:
        """One more unit of work active from ``now`` (monotonic)."""
        if self._active == 0:
            self._active_since = now
        self._active += 1

    def _leave(self, now: float) -> None:
        self._active -= 1
        if self._active == 0:
            self._busy += now - self._active_since

    def _times(self, now: float) -> tuple[float, float]:
        """(busy seconds, running seconds) up to ``now``."""
        end = self._stopped_at if self._stopped_at is not None else now
        busy = self._busy + (now - self._active_since if self._active else 0.0)
        elapsed = end - self._started_at if self._started_at is not None else 0.0
        return busy, elapsed

    def _shared(self, busy: float, elapsed: float) -> dict[str, Any]:
        """The snapshot fields both modes report, by name."""
        return {
            "total_completed": self.completed,
            "total_failed": self.failed,
            "busy_time_s": busy,
            "idle_time_s": max(0.0, elapsed - busy),
            **percentiles("queue_wait", self.queue_waits),
            **percentiles("latency", self.latencies),
        }


class BatchRecorder(Recorder):
    """Batch mode: counted once per batch entering and leaving ``process_fn``."""

    def __init__(self, latency_samples: int = 10_000) -> None:
        super().__init__(latency_samples)
        self.batches = 0
        self.batch_records = 0
        self.batch_cost = 0
        self.oversized = 0
        self.padding_sum = 0.0

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
        self._enter(time.monotonic())

    def batch_finished(self, completed: int, failed: int, now: float, enqueued_at: Iterable[float]) -> None:
        """Count a batch leaving ``process_fn`` at ``now``: records resolved, failed, and enqueue times."""
        self.completed += completed
        self.failed += failed
        self.latencies.extend([now - t for t in enqueued_at])
        self._leave(time.monotonic())

    def snapshot(self, queue_depth: int, queued_cost: int, in_flight: int, withdrawn: int = 0) -> BatchStats:
        """A :class:`BatchStats` from the counters and the queue now; ``withdrawn``: records still queued
        whose callers cancelled them (counted as cancelled, not in ``queue_depth``/``queued_cost``)."""
        busy, elapsed = self._times(time.monotonic())
        batches = self.batches
        cancelled = self.cancelled + withdrawn
        return BatchStats(
            total_submitted=self.completed + cancelled + queue_depth + in_flight,
            total_batches=batches,
            total_batch_cost=self.batch_cost,
            avg_batch_size=self.batch_records / batches if batches else 0.0,
            avg_batch_cost=self.batch_cost / batches if batches else 0.0,
            total_cancelled=cancelled,
            total_oversized=self.oversized,
            queue_depth=queue_depth,
            queued_cost=queued_cost,
            in_flight=in_flight,
            padding_waste=self.padding_sum / batches if batches else 0.0,
            **self._shared(busy, elapsed),
        )


class _Level:
    """A level that changes in steps, and its integral over the running time (for time averages)."""

    __slots__ = ("area", "since", "value")

    def __init__(self) -> None:
        self.value = 0.0
        self.area = 0.0
        self.since = time.monotonic()

    def set(self, value: float, now: float, running: bool) -> None:
        if running:
            self.area += self.value * (now - self.since)
        self.since = now
        self.value = value

    def area_to(self, now: float, running: bool) -> float:
        return self.area + (self.value * (now - self.since) if running else 0.0)


class AdmissionRecorder(Recorder):
    """Continuous mode: counted once per record submitted, admitted, released and finished."""

    def __init__(self, latency_samples: int = 10_000) -> None:
        super().__init__(latency_samples)
        self.submitted = 0
        self.admitted = 0
        self.admitted_cost = 0
        self.admitted_by_tenant: OrderedDict[Any, int] = OrderedDict()  # most recently admitted last
        self.first_outputs: deque[float] = deque(maxlen=latency_samples)
        self._occupancy = _Level()
        self._in_flight = _Level()

    def admit(self, cost: int, waited: float, occupancy: float, in_flight: int, tenant: Any = None) -> None:
        """Count a record of ``tenant`` admitted after ``waited`` seconds; then ``occupancy`` (in-flight cost /
        budget) and ``in_flight`` records."""
        self.admitted += 1
        self.admitted_cost += cost
        by_tenant = self.admitted_by_tenant
        by_tenant[tenant] = by_tenant.get(tenant, 0) + cost
        by_tenant.move_to_end(tenant)
        if len(by_tenant) > TENANTS_KEPT:
            by_tenant.popitem(last=False)
        self.queue_waits.append(waited)
        now = time.monotonic()
        self._enter(now)
        self._levels(now, occupancy, in_flight)

    def release(self, occupancy: float, in_flight: int) -> None:
        """Count a record leaving the engine (finished, failed or withdrawn)."""
        now = time.monotonic()
        self._leave(now)
        self._levels(now, occupancy, in_flight)

    def _levels(self, now: float, occupancy: float, in_flight: int) -> None:
        self._occupancy.set(occupancy, now, self.running)
        self._in_flight.set(in_flight, now, self.running)

    def finish(self, failed: bool, latency: float) -> None:
        """Count a record whose future or stream ended with its result (or its error) after it ran."""
        self.completed += 1
        self.failed += failed
        self.latencies.append(latency)

    def first_output(self, seconds: float) -> None:
        """Count a record's first output, ``seconds`` after it was submitted."""
        self.first_outputs.append(seconds)

    def snapshot(
        self,
        queue_depth: int,
        queued_cost: int,
        in_flight: int,
        in_flight_cost: int,
        budget: int,
        by_priority: tuple[dict[int, int], dict[int, int]] = ({}, {}),
        queued_by_tenant: dict[Any, int] | None = None,
    ) -> AdmissionStats:
        """An :class:`AdmissionStats` from the counters and the batcher's queue and flight now;
        ``by_priority``: (queued + in-flight cost, in-flight cost) per priority; ``queued_by_tenant``: records
        queued per tenant."""
        now = time.monotonic()
        busy, elapsed = self._times(now)
        occupancy_area = self._occupancy.area_to(now, self.running)
        in_flight_area = self._in_flight.area_to(now, self.running)
        return AdmissionStats(
            total_submitted=self.submitted,
            total_admitted=self.admitted,
            total_cancelled=self.cancelled,
            total_admitted_cost=self.admitted_cost,
            queue_depth=queue_depth,
            queued_cost=queued_cost,
            in_flight=in_flight,
            in_flight_cost=in_flight_cost,
            budget=budget,
            budget_occupancy=in_flight_cost / budget if budget else 0.0,
            mean_budget_occupancy=occupancy_area / elapsed if elapsed > 0 else 0.0,
            mean_in_flight=in_flight_area / busy if busy > 0 else 0.0,
            **self._shared(busy, elapsed),
            **percentiles("first_output", self.first_outputs),
            tokens_by_priority=dict(by_priority[0]),
            in_flight_by_priority=dict(by_priority[1]),
            admitted_cost_by_tenant=dict(self.admitted_by_tenant),
            queued_by_tenant=dict(queued_by_tenant or {}),
        )

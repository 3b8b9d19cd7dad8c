"""``DynamicBatcher``: gather records from many concurrent producers into cost-budgeted batches.

Two kinds of loop run on the event loop, as in the reference (flyte.extras):

1. The **aggregation loop** cuts batches from the queue: when the queue holds a full batch (the cost
   budget or ``max_batch_size`` is reached), or when the oldest record has waited ``batch_timeout_s``.
2. ``max_concurrent_batches`` **processing loops** call ``process_fn`` and resolve each record's future
   (:mod:`batching.processing`).

Unlike the reference, the aggregation loop sleeps on one timer per batch instead of one
``asyncio.wait_for`` per record, cuts a partial batch only when a processing loop is free to take it (so
the queue keeps filling while the engine is busy), never lets a batch exceed its budget, keeps FIFO order,
and resolves every future exactly once whatever ``process_fn`` does.
"""

from __future__ import annotations

import asyncio
import inspect
import math
import numbers
from collections.abc import Sequence
from typing import Generic

from .base import RUNNING, STOPPING, positive_int
from .policies import COST, ENQUEUED_AT, FUTURE, Entry, take_fifo, take_length_aware
from .processing import BatchProcessor, wake
from .protocols import CostEstimatorFn, ProcessFn, RecordT, ResultT
from .stats import BatchStats

__all__ = ["PURGE_INTERVAL_S", "DynamicBatcher"]

PURGE_INTERVAL_S = 0.05  # how often a full queue is scanned for records whose callers cancelled them


class DynamicBatcher(BatchProcessor, Generic[RecordT, ResultT]):
    """Batch records from concurrent producers through one processing function.

    Example::

        async def process(batch: list[str]) -> list[int]:
            return [len(item) for item in batch]

        async with DynamicBatcher(process, target_batch_cost=1_000, max_batch_size=64) as batcher:
            futures = [await batcher.submit(text, estimated_cost=len(text)) for text in texts]
            lengths = await asyncio.gather(*futures)

    Args:
        process_fn: ``(batch) -> results``, results in input order and of the same length. An
            ``async def`` runs on the event loop; a plain function runs in a worker thread.
        cost_estimator: ``(record) -> int``; otherwise ``record.estimate_cost()``, otherwise ``default_cost``.
        target_batch_cost: the cost budget of a batch, a ceiling: only a single record costlier than the
            budget exceeds it, and it runs alone.
        max_batch_size: most records in a batch.
        min_batch_size: fewest records for a batch cut before its timeout; the timeout and ``stop()``
            always dispatch, so no record waits past ``batch_timeout_s`` because of it.
        batch_timeout_s: longest the oldest queued record waits for its batch to fill, once a processing
            loop is free to take it.
        max_queue_size: most queued records; ``submit`` waits (backpressure) and ``submit_nowait`` raises
            :class:`~batching.QueueFullError` beyond it.
        prefetch_batches: most full batches cut ahead while every processing loop is busy.
        default_cost: the cost of a record with no other estimate.
        max_concurrent_batches: batches allowed inside ``process_fn`` at once (engines with their own
            continuous batching, such as vLLM's AsyncLLM, profit from more than one).
        padded: the budget counts a batch as a padded engine computes it, batch size x its largest cost
            (encoders, plain ``generate`` calls: every record is padded to the longest), not the sum.
        length_aware: cut each batch from records of similar cost within the first ``lookahead`` queued
            records (always including the oldest), to cut padding; the default is strict FIFO.
        lookahead: the look-ahead window of ``length_aware``; default ``16 * max_batch_size`` (wider windows
            group lengths more tightly, at O(window log window) per batch cut).
        batch_overhead: with ``padded`` and ``length_aware``, what the engine spends on a batch whatever its
            size, in cost units (a CPU encoder: tens of tokens' worth); a record then joins a batch only if it
            raises the batch's costs over its padded cost plus this, so a thin queue of scattered lengths gets
            smaller batches that pad less. 0: the budget alone decides.
        isolate_failures: when a batch fails, retry its halves (recursively) so only the records that
            fail on their own get the error.
        latency_samples: how many recent per-record latencies the percentiles in ``stats`` cover.
    """

    def __init__(
        self,
        process_fn: ProcessFn[RecordT, ResultT],
        *,
        cost_estimator: CostEstimatorFn[RecordT] | None = None,
        target_batch_cost: int = 32_000,
        max_batch_size: int = 256,
        min_batch_size: int = 1,
        batch_timeout_s: float = 0.05,
        max_queue_size: int = 5_000,
        prefetch_batches: int = 2,
        default_cost: int = 1,
        max_concurrent_batches: int = 1,
        length_aware: bool = False,
        lookahead: int | None = None,
        padded: bool = False,
        batch_overhead: int = 0,
        isolate_failures: bool = False,
        latency_samples: int = 10_000,
    ) -> None:
        super().__init__(
            process_fn,
            cost_estimator,
            max_queue_size=max_queue_size,
            default_cost=default_cost,
            latency_samples=latency_samples,
        )
        self._target = positive_int("target_batch_cost", target_batch_cost)
        self._max_batch_size = positive_int("max_batch_size", max_batch_size)
        self._min_batch_size = positive_int("min_batch_size", min_batch_size)
        if self._min_batch_size > self._max_batch_size:
            raise ValueError(f"min_batch_size ({min_batch_size}) must not exceed max_batch_size ({max_batch_size})")
        if (
            isinstance(batch_timeout_s, bool)
            or not isinstance(batch_timeout_s, numbers.Real)
            or not math.isfinite(batch_timeout_s)
            or batch_timeout_s < 0
        ):
            raise ValueError(f"batch_timeout_s must be a finite number >= 0, got {batch_timeout_s!r}")
        self._timeout = float(batch_timeout_s)
        self._prefetch = positive_int("prefetch_batches", prefetch_batches)
        self._concurrency = positive_int("max_concurrent_batches", max_concurrent_batches)
        self._lookahead = positive_int("lookahead", lookahead) if lookahead is not None else 16 * self._max_batch_size
        self._length_aware = bool(length_aware)
        self._padded = bool(padded)
        if isinstance(batch_overhead, bool) or not isinstance(batch_overhead, int) or batch_overhead < 0:
            raise ValueError(f"batch_overhead must be an int >= 0, got {batch_overhead!r}")
        self._overhead = batch_overhead
        self._isolate = bool(isolate_failures)

        call = getattr(process_fn, "__call__", None)  # noqa: B004 - callable objects with async __call__
        self._is_async = inspect.iscoroutinefunction(process_fn) or inspect.iscoroutinefunction(call)
        self._in_flight = 0
        self._wakeup: asyncio.Future | None = None
        self._ready = asyncio.Queue()
        self._busy_loops = 0
        self._tasks: list[asyncio.Task] = []
        self._aborting = False
        self._next_purge = 0.0

    # -- Public API ----------------------------------------------------------------------------------

    @property
    def stats(self) -> BatchStats:
        """A fresh :class:`BatchStats` snapshot; ``stats.to_dict()`` gives a plain dict for export.

        Reading it changes nothing: queued records whose callers cancelled them count as cancelled, not
        queued, though they keep their places until the queue is next purged.
        """
        withdrawn = [entry[COST] for entry in self._queue if entry[FUTURE].done()]
        return self._stats.snapshot(
            len(self._queue) - len(withdrawn), self._queued_cost - sum(withdrawn), self._in_flight, len(withdrawn)
        )

    async def submit(self, record: RecordT, *, estimated_cost: int | None = None) -> asyncio.Future[ResultT]:
        """Queue one record and return the future of its result; waits while the queue is full.

        Raises:
            RuntimeError: if the batcher is not running (:class:`~batching.BatcherStoppedError` once it
                is stopping).
            ValueError, TypeError: if the record's cost is negative or not a number.
        """
        if self._state is not RUNNING:
            self._refuse()
        cost = self._cost_of(record, estimated_cost)
        if len(self._queue) + self._admission.debt >= self._max_queue_size and (
            not self._purge_cancelled() or not self._admission.has_room()
        ):
            await self._wait_for_room()
        return self._enqueue(record, cost)

    def submit_nowait(self, record: RecordT, *, estimated_cost: int | None = None) -> asyncio.Future[ResultT]:
        """Like :meth:`submit` but never waits: raises :class:`~batching.QueueFullError` when full."""
        if self._state is not RUNNING:
            self._refuse()
        cost = self._cost_of(record, estimated_cost)
        self._check_room(1, cost)
        return self._enqueue(record, cost)

    async def submit_batch(
        self, records: Sequence[RecordT], *, estimated_cost: Sequence[int] | None = None
    ) -> list[asyncio.Future[ResultT]]:
        """Queue several records (all costs checked first, so a bad one queues none); one future each."""
        if self._state is not RUNNING:
            self._refuse()
        costs = self._costs_of(records, estimated_cost)
        futures: list[asyncio.Future[ResultT]] = []
        try:
            for record, cost in zip(records, costs):
                futures.append(await self.submit(record, estimated_cost=cost))
        except BaseException:
            for future in futures:  # nobody will hold these: drop them rather than run them unobserved
                future.cancel()
            raise
        return futures

    def submit_batch_nowait(
        self, records: Sequence[RecordT], *, estimated_cost: Sequence[int] | None = None
    ) -> list[asyncio.Future[ResultT]]:
        """All-or-nothing :meth:`submit_batch` that never waits: raises
        :class:`~batching.QueueFullError` unless every record fits."""
        if self._state is not RUNNING:
            self._refuse()
        costs = self._costs_of(records, estimated_cost)
        self._check_room(len(costs), sum(costs))
        return [self._enqueue(record, cost) for record, cost in zip(records, costs)]

    # -- Lifecycle -----------------------------------------------------------------------------------

    def _launch(self, loop: asyncio.AbstractEventLoop) -> None:
        self._ready = asyncio.Queue()
        self._aborting = False
        name = type(self).__name__
        self._tasks = [loop.create_task(self._aggregation_loop(), name=f"{name}-aggregator")]
        self._tasks += [
            loop.create_task(self._processing_loop(), name=f"{name}-processor-{i}") for i in range(self._concurrency)
        ]
        for task in self._tasks:
            task.add_done_callback(self._on_loop_done)

    # -- Submission ----------------------------------------------------------------------------------

    def _check_room(self, count: int, cost: int) -> None:
        if not self._admission.has_room(count) and not (self._purge_cancelled() and self._admission.has_room(count)):
            raise self._refusal(
                f"queue full: {len(self._queue)} of max_queue_size={self._max_queue_size} records queued, "
                f"{count} more asked for",
                cost,
                count,
            )

    def _purge_cancelled(self) -> int:
        """Drop queued records whose callers cancelled them, freeing their places and budget.

        A cancelled future stays in the queue until something looks (a per-record done-callback would cost
        every record a loop callback). This scan runs at most once per ``PURGE_INTERVAL_S``, when the queue
        is full: scanning on every full-queue submit would make backpressure quadratic. Returns how many
        places it freed (and handed to waiting producers).
        """
        now = self._clock()
        if now < self._next_purge:
            return 0
        self._next_purge = now + PURGE_INTERVAL_S
        queue = self._queue
        live = [entry for entry in queue if not entry[FUTURE].done()]
        dropped = len(queue) - len(live)
        if dropped:
            queue.clear()
            queue.extend(live)
            self._queued_cost = sum(entry[COST] for entry in live)
            self._stats.cancelled += dropped
            self._admission.grant()
        return dropped

    def _enqueue(self, record: RecordT, cost: int) -> asyncio.Future:
        future = self._loop.create_future()
        queue = self._queue
        queue.append((record, cost, future, self._clock()))
        self._queued_cost += cost
        if self._wakeup is not None and (len(queue) == 1 or self._queue_full()):
            wake(self._wakeup)
            self._wakeup = None
        return future

    # -- Aggregation loop ----------------------------------------------------------------------------

    def _queue_full(self) -> bool:
        """Whether the queue holds a full batch (by budget or size) of at least ``min_batch_size``."""
        queued = len(self._queue)
        return queued >= self._min_batch_size and (self._queued_cost >= self._target or queued >= self._max_batch_size)

    async def _sleep(self, deadline: float | None) -> None:
        """Sleep until ``deadline`` or until a producer, a processing loop or ``stop`` wakes us."""
        waiter = self._wakeup = self._loop.create_future()
        timer = self._loop.call_at(deadline, wake, waiter) if deadline is not None else None
        try:
            await waiter
        finally:
            self._wakeup = None
            if timer is not None:
                timer.cancel()

    async def _aggregation_loop(self) -> None:
        ready = self._ready
        try:
            while True:
                queue = self._queue
                if not queue:
                    if self._state is STOPPING:
                        return
                    await self._sleep(None)
                    continue
                if self._state is STOPPING or self._queue_full():
                    may_cut = ready.qsize() < self._prefetch
                else:
                    deadline = queue[0][ENQUEUED_AT] + self._timeout
                    if self._clock() < deadline:
                        await self._sleep(deadline)
                        continue
                    may_cut = self._busy_loops + ready.qsize() < self._concurrency
                if may_cut:
                    ready.put_nowait(self._cut_batch())
                else:
                    await self._sleep(None)  # a processing loop wakes us when it frees up
        finally:
            for _ in range(self._concurrency):
                ready.put_nowait(None)

    def _cut_batch(self) -> list[Entry]:
        if self._length_aware:
            batch, cost = take_length_aware(
                self._queue, self._target, self._max_batch_size, self._lookahead, self._padded, self._overhead
            )
        else:
            batch, cost = take_fifo(self._queue, self._target, self._max_batch_size, self._padded)
        self._queued_cost -= cost
        self._in_flight += len(batch)
        self._admission.grant()
        return batch

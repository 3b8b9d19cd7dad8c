"""``DynamicBatcher``: gather records from many concurrent producers into cost-budgeted batches.

Two kinds of loop run on the event loop, as in the reference (flyte.extras):

1. The **aggregation loop** cuts batches from the queue: when the queue holds a full batch (the cost
   budget or ``max_batch_size`` is reached), or when the oldest record has waited ``batch_timeout_s``.
2. ``max_concurrent_batches`` **processing loops** call ``process_fn`` and resolve each record's future.

Unlike the reference, the aggregation loop sleeps on one timer per batch instead of one
``asyncio.wait_for`` per record, cuts a partial batch only when a processing loop is free to take it (so
the queue keeps filling while the engine is busy), never lets a batch exceed its budget, keeps FIFO order,
and resolves every future exactly once whatever ``process_fn`` does.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import math
import numbers
import time
from collections import deque
from collections.abc import Sequence
from typing import Any, Generic

from .admission import Admission
from .errors import BatchCancelledError, BatcherError, BatcherStoppedError, QueueFullError
from .policies import COST, ENQUEUED_AT, FUTURE, RECORD, Entry, take_fifo, take_length_aware
from .protocols import CostEstimatorFn, ProcessFn, RecordT, ResultT
from .stats import BatchStats, StatsRecorder

__all__ = ["DynamicBatcher"]

logger = logging.getLogger(__name__)

_IDLE, _RUNNING, _STOPPING = "idle", "running", "stopping"
PURGE_INTERVAL_S = 0.05  # how often a full queue is scanned for records whose callers cancelled them


def _positive_int(name: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be a positive integer, got {value!r}")
    return value


def _check_cost(cost: Any, source: str) -> int:
    """A cost as a non-negative int (floats round up); ``source`` names where it came from."""
    if cost.__class__ is int and cost >= 0:
        return cost
    if isinstance(cost, bool) or not isinstance(cost, numbers.Real):
        raise TypeError(f"{source} must be a non-negative number, got {type(cost).__name__} {cost!r}")
    if not math.isfinite(cost) or cost < 0:
        raise ValueError(f"{source} must be a non-negative number, got {cost!r}")
    return math.ceil(cost)


def _wake(future: asyncio.Future | None) -> None:
    if future is not None and not future.done():
        future.set_result(None)


class DynamicBatcher(Generic[RecordT, ResultT]):
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
        isolate_failures: when a batch fails, retry its halves (recursively) so only the records that
            fail on their own get the error.
        latency_samples: how many recent per-record latencies the percentiles in ``stats`` cover.
    """

    _cost_methods: tuple[str, ...] = ("estimate_cost",)

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
        isolate_failures: bool = False,
        latency_samples: int = 10_000,
    ) -> None:
        if not callable(process_fn):
            raise TypeError(f"process_fn must be callable, got {process_fn!r}")
        if cost_estimator is not None and not callable(cost_estimator):
            raise TypeError(f"cost_estimator must be callable or None, got {cost_estimator!r}")
        self._target = _positive_int("target_batch_cost", target_batch_cost)
        self._max_batch_size = _positive_int("max_batch_size", max_batch_size)
        self._min_batch_size = _positive_int("min_batch_size", min_batch_size)
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
        self._max_queue_size = _positive_int("max_queue_size", max_queue_size)
        self._prefetch = _positive_int("prefetch_batches", prefetch_batches)
        self._default_cost = _check_cost(default_cost, "default_cost")
        self._concurrency = _positive_int("max_concurrent_batches", max_concurrent_batches)
        self._lookahead = _positive_int("lookahead", lookahead) if lookahead is not None else 16 * self._max_batch_size
        self._length_aware = bool(length_aware)
        self._padded = bool(padded)
        self._isolate = bool(isolate_failures)
        self._stats = StatsRecorder(_positive_int("latency_samples", latency_samples))

        self._process_fn = process_fn
        self._cost_estimator = cost_estimator
        call = getattr(process_fn, "__call__", None)  # noqa: B004 - callable objects with async __call__
        self._is_async = inspect.iscoroutinefunction(process_fn) or inspect.iscoroutinefunction(call)

        self._state = _IDLE
        self._queue: deque[Entry] = deque()
        self._queued_cost = 0
        self._in_flight = 0
        self._admission = Admission(self._max_queue_size, self._queue.__len__)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._clock = time.monotonic
        self._wakeup: asyncio.Future | None = None
        self._ready: asyncio.Queue[list[Entry] | None] = asyncio.Queue()
        self._busy_loops = 0
        self._tasks: list[asyncio.Task] = []
        self._aborting = False
        self._next_purge = 0.0

    # -- Public API ----------------------------------------------------------------------------------

    @property
    def is_running(self) -> bool:
        """Whether the loops are active (``start`` called and ``stop`` not yet finished)."""
        return self._state is not _IDLE

    @property
    def stats(self) -> BatchStats:
        """A fresh :class:`BatchStats` snapshot; ``stats.to_dict()`` gives a plain dict for export."""
        self._purge_cancelled(force=True)
        return self._stats.snapshot(len(self._queue), self._queued_cost, self._in_flight)

    async def start(self) -> None:
        """Start the aggregation and processing loops on the running event loop.

        Raises:
            RuntimeError: if the batcher is already running.
        """
        if self._state is not _IDLE:
            raise RuntimeError(f"{type(self).__name__} is already running; call stop() before start()")
        loop = self._loop = asyncio.get_running_loop()
        # Deadlines go to loop.call_at, so enqueue times use the loop's clock (time.monotonic by default).
        self._clock = time.monotonic if type(loop).time is asyncio.BaseEventLoop.time else loop.time
        self._ready = asyncio.Queue()
        self._aborting = False
        self._state = _RUNNING
        self._stats.start()
        name = type(self).__name__
        self._tasks = [loop.create_task(self._aggregation_loop(), name=f"{name}-aggregator")]
        self._tasks += [
            loop.create_task(self._processing_loop(), name=f"{name}-processor-{i}") for i in range(self._concurrency)
        ]
        for task in self._tasks:
            task.add_done_callback(self._on_loop_done)
        logger.debug("%s started", name)

    async def stop(self, timeout: float | None = None) -> None:
        """Graceful shutdown: process everything already queued, resolve every future, then stop.

        Producers still waiting for queue space get :class:`~batching.BatcherStoppedError`. With
        ``timeout``, work not finished in time is aborted and its futures fail with
        :class:`~batching.BatcherStoppedError`; without it, ``stop`` returns once ``process_fn`` has
        returned for every queued record.
        """
        if self._state is _IDLE:
            return
        if self._state is _RUNNING:
            self._state = _STOPPING
            self._admission.close(self._stopping_error())
            _wake(self._wakeup)
        _, pending = await asyncio.wait(self._tasks, timeout=timeout)
        if pending:
            logger.warning("%s: stop() timed out after %ss; aborting the rest", type(self).__name__, timeout)
            self._aborting = True
            for task in pending:
                task.cancel()
            await asyncio.wait(pending)
        self._fail_pending(BatcherStoppedError(f"{type(self).__name__} stopped before this record ran"))
        if self._state is not _IDLE:
            self._state = _IDLE
            self._stats.stop()
            logger.debug("%s stopped: %s", type(self).__name__, self.stats)

    async def submit(self, record: RecordT, *, estimated_cost: int | None = None) -> asyncio.Future[ResultT]:
        """Queue one record and return the future of its result; waits while the queue is full.

        Raises:
            RuntimeError: if the batcher is not running (:class:`~batching.BatcherStoppedError` once it
                is stopping).
            ValueError, TypeError: if the record's cost is negative or not a number.
        """
        if self._state is not _RUNNING:
            self._refuse()
        cost = self._cost_of(record, estimated_cost)
        if len(self._queue) + self._admission.debt >= self._max_queue_size and (
            not self._purge_cancelled() or not self._admission.has_room()
        ):
            await self._admission.wait(self._loop)
            if self._state is not _RUNNING:
                self._admission.grant()  # the slot we were given goes to the next in line
                self._refuse()
        return self._enqueue(record, cost)

    def submit_nowait(self, record: RecordT, *, estimated_cost: int | None = None) -> asyncio.Future[ResultT]:
        """Like :meth:`submit` but never waits: raises :class:`~batching.QueueFullError` when full."""
        if self._state is not _RUNNING:
            self._refuse()
        cost = self._cost_of(record, estimated_cost)
        self._check_room(1)
        return self._enqueue(record, cost)

    async def submit_batch(
        self, records: Sequence[RecordT], *, estimated_cost: Sequence[int] | None = None
    ) -> list[asyncio.Future[ResultT]]:
        """Queue several records (all costs checked first, so a bad one queues none); one future each."""
        if self._state is not _RUNNING:
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
        if self._state is not _RUNNING:
            self._refuse()
        costs = self._costs_of(records, estimated_cost)
        self._check_room(len(costs))
        return [self._enqueue(record, cost) for record, cost in zip(records, costs)]

    async def __aenter__(self) -> DynamicBatcher[RecordT, ResultT]:
        await self.start()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.stop()

    # -- Submission ----------------------------------------------------------------------------------

    def _stopping_error(self) -> BatcherStoppedError:
        return BatcherStoppedError(f"{type(self).__name__} is stopping and accepts no new records")

    def _refuse(self) -> None:
        if self._state is _STOPPING:
            raise self._stopping_error()
        raise RuntimeError(
            f"{type(self).__name__} is not running: call `await batcher.start()` first, or use `async with`"
        )

    def _check_room(self, count: int) -> None:
        if not self._admission.has_room(count) and not (self._purge_cancelled() and self._admission.has_room(count)):
            raise QueueFullError(
                f"queue full: {len(self._queue)} of max_queue_size={self._max_queue_size} records queued, "
                f"{count} more asked for"
            )

    def _cost_of(self, record: Any, explicit: Any) -> int:
        """Explicit cost, else the estimator function, else the record's own method(s), else the default."""
        if explicit is not None:
            return _check_cost(explicit, "estimated_cost")
        if self._cost_estimator is not None:
            return _check_cost(self._cost_estimator(record), "cost_estimator")
        for name in self._cost_methods:
            method = getattr(record, name, None)
            if method is not None and callable(method):
                return _check_cost(method(), f"{type(record).__name__}.{name}()")
        return self._default_cost

    def _costs_of(self, records: Sequence[Any], explicit: Sequence[Any] | None) -> list[int]:
        if explicit is None:
            return [self._cost_of(record, None) for record in records]
        if len(explicit) != len(records):
            raise ValueError(
                f"estimated_cost has {len(explicit)} entries but records has {len(records)}; they must match"
            )
        return [self._cost_of(record, cost) for record, cost in zip(records, explicit)]

    def _purge_cancelled(self, force: bool = False) -> int:
        """Drop queued records whose callers cancelled them, freeing their places and budget.

        A cancelled future stays in the queue until something looks (a per-record done-callback would cost
        every record a loop callback). This scan runs when stats are read and, at most once per
        ``PURGE_INTERVAL_S``, when the queue is full: scanning on every full-queue submit would make
        backpressure quadratic. Returns how many places it freed (and handed to waiting producers).
        """
        if not force:
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

    def _enqueue(self, record: Any, cost: int) -> asyncio.Future:
        future = self._loop.create_future()
        queue = self._queue
        queue.append((record, cost, future, self._clock()))
        self._queued_cost += cost
        if self._wakeup is not None and (len(queue) == 1 or self._queue_full()):
            _wake(self._wakeup)
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
        timer = self._loop.call_at(deadline, _wake, waiter) if deadline is not None else None
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
                    if self._state is _STOPPING:
                        return
                    await self._sleep(None)
                    continue
                if self._state is _STOPPING or self._queue_full():
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
                self._queue, self._target, self._max_batch_size, self._lookahead, self._padded
            )
        else:
            batch, cost = take_fifo(self._queue, self._target, self._max_batch_size, self._padded)
        self._queued_cost -= cost
        self._in_flight += len(batch)
        self._admission.grant()
        return batch

    # -- Processing loops ----------------------------------------------------------------------------

    async def _processing_loop(self) -> None:
        ready = self._ready
        while True:
            batch = await ready.get()
            if batch is None:
                return
            self._busy_loops += 1
            _wake(self._wakeup)  # room in the prefetch buffer
            try:
                live = [entry for entry in batch if not entry[FUTURE].done()]
                if len(live) != len(batch):  # cancelled by their callers: never reach process_fn
                    self._stats.cancelled += len(batch) - len(live)
                    self._in_flight -= len(batch) - len(live)
                if live:
                    await self._run(live)
            finally:
                self._busy_loops -= 1
                _wake(self._wakeup)

    async def _call(self, records: list[Any]) -> Any:
        if self._is_async:
            return await self._process_fn(records)
        results = await asyncio.to_thread(self._process_fn, records)
        if inspect.isawaitable(results):
            results = await results
        return results

    async def _run(self, batch: list[Entry]) -> None:
        """Run one batch through ``process_fn`` and resolve each of its futures exactly once."""
        started = self._clock()
        self._stats.batch_started([entry[COST] for entry in batch], started, [e[ENQUEUED_AT] for e in batch])
        if len(batch) == 1 and batch[0][COST] > self._target:
            self._stats.oversized += 1
        error: BaseException | None = None
        try:
            results = await self._call([entry[RECORD] for entry in batch])
            if not isinstance(results, Sequence) or len(results) != len(batch):
                got = f"{len(results)} results" if isinstance(results, Sequence) else repr(type(results))
                raise ValueError(f"process_fn returned {got} for a batch of {len(batch)} records")
        except asyncio.CancelledError as exc:
            task = asyncio.current_task()
            if self._aborting or (task is not None and getattr(task, "cancelling", lambda: 0)()):
                self._finish(batch, BatcherStoppedError("the batcher was stopped while this batch ran"))
                raise
            error = BatchCancelledError("process_fn raised CancelledError (was the engine request aborted?)")
            error.__cause__ = exc
        except Exception as exc:
            error = exc
        except BaseException as exc:
            self._finish(batch, BatcherError(f"process_fn raised {type(exc).__name__}"))
            raise
        if error is None:
            self._finish(batch, None, results)
        elif self._isolate and len(batch) > 1 and not self._aborting:
            self._stats.batch_finished(0, 0, started, ())  # the attempt counts as a batch; its records rerun
            logger.info("batch of %d failed (%r); retrying its halves", len(batch), error)
            middle = len(batch) // 2
            await self._run(batch[:middle])
            await self._run(batch[middle:])
        else:
            logger.warning("batch of %d records failed: %r", len(batch), error)
            self._finish(batch, error)

    def _finish(self, batch: list[Entry], error: BaseException | None, results: Sequence[Any] = ()) -> None:
        if error is None:
            for entry, result in zip(batch, results):
                future = entry[FUTURE]
                if not future.done():  # a caller may have cancelled while the batch ran
                    future.set_result(result)
        else:
            for entry in batch:
                if not entry[FUTURE].done():
                    entry[FUTURE].set_exception(error)
        self._in_flight -= len(batch)
        self._stats.batch_finished(
            len(batch), len(batch) if error is not None else 0, self._clock(), [e[ENQUEUED_AT] for e in batch]
        )

    # -- Failure handling ----------------------------------------------------------------------------

    def _fail_pending(self, error: BaseException) -> None:
        """Fail every future still queued or in the prefetch buffer (after an abort or a crash)."""
        leftovers = list(self._queue)
        self._queue.clear()
        self._queued_cost = 0
        while not self._ready.empty():
            batch = self._ready.get_nowait()
            if batch:
                self._in_flight -= len(batch)
                leftovers.extend(batch)
        failed = 0
        for entry in leftovers:
            if not entry[FUTURE].done():
                entry[FUTURE].set_exception(error)
                failed += 1
        self._stats.cancelled += len(leftovers)
        if failed:
            logger.warning("%s: %d queued records failed: %s", type(self).__name__, failed, error)

    def _on_loop_done(self, task: asyncio.Task) -> None:
        if task.cancelled() or task.exception() is None:
            return
        logger.error("%s: %s crashed", type(self).__name__, task.get_name(), exc_info=task.exception())
        self._state = _STOPPING
        self._admission.close(self._stopping_error())
        self._fail_pending(BatcherError(f"{type(self).__name__} crashed: {task.exception()!r}"))
        for other in self._tasks:
            other.cancel()

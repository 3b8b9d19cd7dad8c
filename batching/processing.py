"""The processing half of :class:`~batching.DynamicBatcher`: ``max_concurrent_batches`` loops take the batches
the aggregation loop cuts, run them through ``process_fn`` and resolve every record's future exactly once,
whatever ``process_fn`` does; and the shutdown and crash handling that fails what can no longer run."""

from __future__ import annotations

import asyncio
import inspect
import logging
from collections.abc import Sequence
from typing import Any

from .base import BaseBatcher
from .errors import BatchCancelledError, BatcherError, BatcherStoppedError
from .policies import COST, ENQUEUED_AT, FUTURE, RECORD, Entry
from .recorders import BatchRecorder

__all__ = ["BatchProcessor", "wake"]

logger = logging.getLogger(__name__)


def wake(future: asyncio.Future | None) -> None:
    """Wake whoever awaits ``future`` (once; nothing if there is none)."""
    if future is not None and not future.done():
        future.set_result(None)


class BatchProcessor(BaseBatcher):
    """Runs cut batches; :class:`~batching.DynamicBatcher` adds the queue, the aggregation loop and the API."""

    _recorder_type = BatchRecorder
    _stats: BatchRecorder
    _ready: asyncio.Queue[list[Entry] | None]
    _wakeup: asyncio.Future | None
    _tasks: list[asyncio.Task]
    _target: int
    _max_batch_size: int
    _concurrency: int
    _isolate: bool
    _is_async: bool
    _in_flight: int  # records cut from the queue and not yet resolved (prefetched or inside process_fn)
    _busy_loops: int
    _aborting: bool  # stop() timed out: what still runs ends with BatcherStoppedError

    def _backlog(self, cost: int, count: int) -> tuple[int, int]:
        """(cost, records) that must be processed before ``cost``/``count`` more, queued behind everything
        queued now, would all start in a batch: the processing loops free now take a full batch each at once;
        the rest waits for the batches ahead to finish."""
        free = max(0, self._concurrency - self._busy_loops - self._ready.qsize())
        return (
            self._queued_cost + cost - free * self._target,
            len(self._queue) + count - free * self._max_batch_size,
        )

    async def _processing_loop(self) -> None:
        ready = self._ready
        while True:
            batch = await ready.get()
            if batch is None:
                return
            self._busy_loops += 1
            wake(self._wakeup)  # room in the prefetch buffer
            try:
                live = [entry for entry in batch if not entry[FUTURE].done()]
                if len(live) != len(batch):  # cancelled by their callers: never reach process_fn
                    self._stats.cancelled += len(batch) - len(live)
                    self._in_flight -= len(batch) - len(live)
                if live:
                    await self._run(live)
            finally:
                self._busy_loops -= 1
                wake(self._wakeup)

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
        self._drain_rate.note(self._clock(), len(batch), sum(entry[COST] for entry in batch))
        self._stats.batch_finished(
            len(batch), len(batch) if error is not None else 0, self._clock(), [e[ENQUEUED_AT] for e in batch]
        )

    # -- Shutdown and failure handling ---------------------------------------------------------------

    async def _drain(self, timeout: float | None) -> None:
        """Let the loops process everything queued; past ``timeout``, abort what is left."""
        wake(self._wakeup)
        _, pending = await asyncio.wait(self._tasks, timeout=timeout)
        if pending:
            logger.warning("%s: stop() timed out after %ss; aborting the rest", type(self).__name__, timeout)
            self._aborting = True
            for task in pending:
                task.cancel()
            await asyncio.wait(pending)
        self._fail_pending(BatcherStoppedError(f"{type(self).__name__} stopped before this record ran"))

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
        self._close()
        self._fail_pending(BatcherError(f"{type(self).__name__} crashed: {task.exception()!r}"))
        for other in self._tasks:
            other.cancel()

"""What both batcher modes share: argument checks, the lifecycle, refusal, cost resolution, the wait for
queue room and the expected wait behind the queue. :class:`~batching.DynamicBatcher` (batches) and
:class:`~batching.ContinuousBatcher` (admission) derive from :class:`BaseBatcher` and add only what is their
own."""

from __future__ import annotations

import asyncio
import logging
import math
import numbers
import time
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any, NoReturn, TypeVar

from .admission import Admission
from .errors import BatcherStoppedError, QueueFullError
from .rates import DrainRate
from .recorders import Recorder

__all__ = ["IDLE", "RUNNING", "STOPPING", "BaseBatcher", "check_cost", "positive_int"]

logger = logging.getLogger(__name__)

IDLE, RUNNING, STOPPING = "idle", "running", "stopping"

_B = TypeVar("_B", bound="BaseBatcher")


def positive_int(name: str, value: Any) -> int:
    """``value`` if it is an int >= 1 (not a bool); else ``ValueError`` naming the parameter ``name``."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be a positive integer, got {value!r}")
    return value


def check_cost(cost: Any, source: str) -> int:
    """A cost as a non-negative int (floats round up); ``source`` names where it came from."""
    if cost.__class__ is int and cost >= 0:
        return cost
    if isinstance(cost, bool) or not isinstance(cost, numbers.Real):
        raise TypeError(f"{source} must be a non-negative number, got {type(cost).__name__} {cost!r}")
    if not math.isfinite(cost) or cost < 0:
        raise ValueError(f"{source} must be a non-negative number, got {cost!r}")
    return math.ceil(cost)


class BaseBatcher:
    """The lifecycle (idle, running, stopping), the bounded queue and its admission, and record costs.

    A subclass sets ``_recorder_type`` (its statistics), fills in :meth:`_launch` (what ``start`` begins),
    :meth:`_drain` (how ``stop`` finishes the work) and :meth:`_backlog` (what must leave before new work
    goes), notes in ``_drain_rate`` the work that leaves, and adds its own ``stats`` snapshot. The queue is
    what :meth:`_new_queue` makes (a deque by default) of whatever the subclass queues; ``_queued_cost`` is
    their summed cost.
    """

    RATE_WINDOW_S = 10.0
    """The recent window (seconds) over which the rate of work leaving is measured, for :meth:`expected_wait`."""

    _cost_methods: tuple[str, ...] = ("estimate_cost",)
    """The record methods asked for a cost, in order, when neither an explicit cost nor an estimator is given."""

    _recorder_type: type[Recorder] = Recorder

    def __init__(
        self,
        process_fn: Callable[..., Any],
        cost_estimator: Callable[[Any], Any] | None,
        *,
        max_queue_size: int,
        default_cost: int,
        latency_samples: int,
    ) -> None:
        if not callable(process_fn):
            raise TypeError(f"process_fn must be callable, got {process_fn!r}")
        if cost_estimator is not None and not callable(cost_estimator):
            raise TypeError(f"cost_estimator must be callable or None, got {cost_estimator!r}")
        self._process_fn = process_fn
        self._cost_estimator = cost_estimator
        self._max_queue_size = positive_int("max_queue_size", max_queue_size)
        self._default_cost = check_cost(default_cost, "default_cost")
        self._stats = self._recorder_type(positive_int("latency_samples", latency_samples))
        self._state = IDLE
        self._queue = self._new_queue()
        self._queued_cost = 0
        self._drain_rate = DrainRate(self.RATE_WINDOW_S)
        self._admission = Admission(self._max_queue_size, self._queue.__len__)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._clock: Callable[[], float] = time.monotonic

    def _new_queue(self) -> Any:
        """The queue, made once in ``__init__``: anything with ``len``."""
        return deque()

    # -- Lifecycle -----------------------------------------------------------------------------------

    @property
    def is_running(self) -> bool:
        """Whether the batcher accepts work or is draining it (``start`` called, ``stop`` not finished)."""
        return self._state is not IDLE

    async def start(self) -> None:
        """Start accepting records on the running event loop (batch mode also starts its aggregation and
        processing loops there; continuous mode runs each admitted record as its own task).

        Raises:
            RuntimeError: if the batcher is already running.
        """
        if self._state is not IDLE:
            raise RuntimeError(f"{type(self).__name__} is already running; call stop() before start()")
        loop = self._loop = asyncio.get_running_loop()
        # Deadlines go to loop.call_at, so times use the loop's clock (time.monotonic, called directly, by default).
        self._clock = time.monotonic if type(loop).time is asyncio.BaseEventLoop.time else loop.time
        self._state = RUNNING
        self._stats.start()
        self._launch(loop)
        logger.debug("%s started", type(self).__name__)

    async def stop(self, timeout: float | None = None) -> None:
        """Graceful shutdown: finish everything already queued or in flight, end every future (and stream)
        exactly once, then stop.

        Producers still waiting for queue room get :class:`~batching.BatcherStoppedError`, and so does a
        submission while stopping. With ``timeout``, what has not finished in time is aborted and ends with
        :class:`~batching.BatcherStoppedError`; without it, ``stop`` waits for all of it to finish.
        """
        if self._state is IDLE:
            return
        if self._state is RUNNING:
            self._close()
        await self._drain(timeout)
        if self._state is not IDLE:
            self._state = IDLE
            self._stats.stop()
            if logger.isEnabledFor(logging.DEBUG):
                logger.debug("%s stopped: %s", type(self).__name__, self.stats)

    async def __aenter__(self: _B) -> _B:
        await self.start()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.stop()

    def _launch(self, loop: asyncio.AbstractEventLoop) -> None:
        """Begin what runs while the batcher runs (``start``, once the state is running)."""

    async def _drain(self, timeout: float | None) -> None:
        """Finish (or, past ``timeout``, abort) the queued and in-flight work (``stop``, once stopping)."""

    def _close(self) -> None:
        """Accept nothing more: refuse new records and fail the producers waiting for queue room."""
        self._state = STOPPING
        self._admission.close(self._stopping_error())

    # -- The expected wait ---------------------------------------------------------------------------

    def expected_wait(self, cost: int = 0, count: int = 1) -> float | None:
        """Seconds until ``count`` more records of total ``cost``, queued now behind everything queued, would
        all be admitted (continuous mode) or start in a batch (batch mode), at the rate at which records
        and cost have been leaving over the last ``RATE_WINDOW_S`` seconds (the slower decides).

        0.0 when they would go at once; ``None`` when they would wait but nothing has finished lately, so
        there is no basis for an estimate. What a refusal's ``Retry-After`` and ``max_queue_wait_s`` use.
        """
        cost_over, count_over = self._backlog(check_cost(cost, "cost"), check_cost(count, "count"))
        return self._drain_rate.wait(self._clock(), cost_over, count_over)

    def _backlog(self, cost: int, count: int) -> tuple[int, int]:
        """(cost, records) that must leave before ``count`` more records of ``cost`` would all go, behind
        what is queued now (at most 0 each when they would go at once)."""
        raise NotImplementedError

    def _refusal(self, message: str, cost: int, count: int, wait: float | None = None) -> QueueFullError:
        """A :class:`~batching.QueueFullError` refusing ``count`` records of ``cost``, with the expected wait
        (``wait`` if already known) as its ``retry_after_s``."""
        return QueueFullError(message, retry_after_s=self.expected_wait(cost, count) if wait is None else wait)

    # -- Submission ----------------------------------------------------------------------------------

    def _stopping_error(self) -> BatcherStoppedError:
        return BatcherStoppedError(f"{type(self).__name__} is stopping and accepts no new records")

    def _refuse(self) -> NoReturn:
        """Raise why a record is not accepted now: the batcher is stopping, or not started."""
        if self._state is STOPPING:
            raise self._stopping_error()
        raise RuntimeError(
            f"{type(self).__name__} is not running: call `await batcher.start()` first, or use `async with`"
        )

    async def _wait_for_room(self) -> None:
        """Wait, first come first served, for a place in the full queue; refuse if the batcher stopped
        meanwhile. On return one place is reserved for the caller, who must enqueue without awaiting."""
        await self._admission.wait(self._loop)
        if self._state is not RUNNING:
            self._admission.grant()  # the slot we were given goes to the next in line
            self._refuse()

    def _cost_of(self, record: Any, explicit: Any) -> int:
        """Explicit cost, else the estimator function, else the record's own method(s), else the default."""
        if explicit is not None:
            return check_cost(explicit, "estimated_cost")
        if self._cost_estimator is not None:
            return check_cost(self._cost_estimator(record), "cost_estimator")
        for name in self._cost_methods:
            method = getattr(record, name, None)
            if callable(method):
                return check_cost(method(), f"{type(record).__name__}.{name}()")
        return self._default_cost

    @staticmethod
    def _check_cost_count(records: Sequence[Any], explicit: Sequence[Any] | None) -> None:
        if explicit is not None and len(explicit) != len(records):
            raise ValueError(
                f"estimated_cost has {len(explicit)} entries but records has {len(records)}; they must match"
            )

    def _costs_of(self, records: Sequence[Any], explicit: Sequence[Any] | None) -> list[int]:
        """Every record's cost (all checked before any is queued); ``explicit``: one cost or None each."""
        self._check_cost_count(records, explicit)
        if explicit is None:
            return [self._cost_of(record, None) for record in records]
        return [self._cost_of(record, cost) for record, cost in zip(records, explicit)]

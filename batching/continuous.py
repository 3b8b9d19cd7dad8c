"""``ContinuousBatcher``: token-budgeted *admission* in front of an engine that batches continuously (vLLM).

A static-batch engine wants whole batches (:class:`~batching.DynamicBatcher`). An engine with continuous
batching already packs every request it holds into each step; a batch boundary in front of it is a barrier
that leaves it under-filled while each batch's longest request finishes. What it needs instead is
admission: start each record as soon as its cost fits ``max_inflight_cost - cost in flight`` (and the
in-flight count cap), give its cost back the moment *that* record finishes, and stream its output as it
comes. This is TGI's router and LightLLM's scheduler, as a small asyncio library.

Example::

    async def generate(prompt: Prompt) -> AsyncIterator[str]:      # or an async def returning one result
        async for token in engine.stream(prompt.text):
            yield token

    async with ContinuousBatcher(generate, max_inflight_cost=16_384) as batcher:
        async with await batcher.stream(Prompt("Tell me a story")) as tokens:   # each output as it comes
            async for token in tokens:
                print(token, end="")
        last = await (await batcher.submit(Prompt("2+2?")))          # a future of the last output

Guarantees (property-tested): the cost in flight never exceeds the budget except a single record costlier
than the whole budget, which then runs alone; every future and stream handed out ends exactly once; strict
FIFO admission by default (the head waits rather than being overtaken); a cancelled record leaves the queue
or the engine at once and its cost returns to the budget; ``stop()`` drains; the queue is bounded.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import Any, Generic, Literal

from .admission import Admission
from .batcher import _check_cost, _positive_int
from .errors import BatchCancelledError, BatcherStoppedError, QueueFullError
from .protocols import CostEstimatorFn, RecordT, ResultT
from .stats import BatchStats, StatsRecorder

__all__ = ["ContinuousBatcher", "RecordStream", "peak_cost"]

logger = logging.getLogger(__name__)

StreamFn = Callable[[RecordT], AsyncIterator[ResultT] | Awaitable[ResultT]]
"""``(record) -> outputs``: an async generator (each output is streamed; the last is the result) or an
``async def`` returning the one result."""

_IDLE, _RUNNING, _STOPPING = "idle", "running", "stopping"
_QUEUED, _ADMITTED, _DONE = 0, 1, 2
_END = object()


def peak_cost(running: Sequence[tuple[int, int]]) -> int:
    """LightLLM's peak estimate: the most tokens ``running`` will ever hold at once.

    Each item is ``(tokens held now, tokens it may still add)``. Sorted by what they may still add, longest
    first, the ``i``-th request finishes last among the ``i + 1`` longest; at that moment those ``i + 1``
    have each grown by its remaining length while every shorter one has already freed its tokens.

    >>> peak_cost([(100, 10), (100, 50)])   # 220, not 260: the short one leaves before the long one peaks
    220
    """
    peak = held = 0
    for count, (now, remaining) in enumerate(sorted(running, key=lambda item: -item[1]), start=1):
        held += now
        peak = max(peak, held + remaining * count)
    return peak


class RecordStream(Generic[ResultT]):
    """One record's outputs, in order, as the engine produces them; ends exactly once.

    Iterate it (``async for``); it raises the processing error if the record failed, or
    :class:`~batching.BatcherStoppedError` if the batcher stopped before it ran. ``aclose()`` (also on leaving
    ``async with``) withdraws the record: from the queue if it has not started, else by cancelling its run,
    which frees its cost at once.
    """

    __slots__ = ("_buffer", "_cancel", "_ended", "_waiter")

    def __init__(self, cancel: Callable[[], None]) -> None:
        self._buffer: deque[Any] = deque()
        self._waiter: asyncio.Future | None = None
        self._ended = False
        self._cancel = cancel

    # -- producer side (the batcher) ----------------------------------------------------------------

    def _push(self, item: Any) -> None:
        if self._ended:
            return
        self._buffer.append(item)
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)

    def _end(self, error: BaseException | None = None) -> None:
        if not self._ended:
            self._push(_END if error is None else _Failure(error))
            self._ended = True

    # -- consumer side ------------------------------------------------------------------------------

    @property
    def done(self) -> bool:
        """Whether the stream has ended (finished, failed or withdrawn)."""
        return self._ended

    def __aiter__(self) -> RecordStream[ResultT]:
        return self

    async def __anext__(self) -> ResultT:
        while not self._buffer:
            self._waiter = asyncio.get_running_loop().create_future()
            try:
                await self._waiter
            finally:
                self._waiter = None
        item = self._buffer[0]
        if item is _END:
            raise StopAsyncIteration
        if isinstance(item, _Failure):
            raise item.error
        self._buffer.popleft()
        return item

    async def aclose(self) -> None:
        """Withdraw the record if it has not finished (idempotent)."""
        if not self._ended:
            self._cancel()

    async def __aenter__(self) -> RecordStream[ResultT]:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()


class _Failure:
    __slots__ = ("error",)

    def __init__(self, error: BaseException) -> None:
        self.error = error


class _Ticket:
    """One submitted record: where it is, what it costs, and where its outputs go."""

    __slots__ = (
        "cost",
        "enqueued_at",
        "first_output",
        "growth",
        "last",
        "produced",
        "record",
        "sink",
        "started_at",
        "state",
        "task",
    )

    def __init__(self, record: Any, cost: int, growth: int, sink: asyncio.Future | RecordStream, now: float) -> None:
        self.record = record
        self.cost = cost
        self.growth = growth
        self.sink = sink
        self.enqueued_at = now
        self.state = _QUEUED
        self.task: asyncio.Task | None = None
        self.produced = 0  # tokens added so far (the peak estimate's progress)
        self.started_at = 0.0
        self.first_output = False
        self.last: Any = _END

    def held(self) -> tuple[int, int]:
        """(tokens held now, tokens it may still add), for :func:`peak_cost`."""
        produced = min(self.produced, self.growth)
        return self.cost - self.growth + produced, self.growth - produced


class ContinuousBatcher(Generic[RecordT, ResultT]):
    """Admit records into ``process_fn`` one by one while their cost in flight fits a budget.

    Args:
        process_fn: ``(record) -> outputs``: an async generator (outputs streamed, the last one is the
            result of :meth:`submit`) or an ``async def`` returning the result. It runs as its own task; a
            cancelled record cancels it (an engine stream aborts its request on cancellation).
        cost_estimator: ``(record) -> int``; otherwise ``record.estimate_tokens()``, then
            ``record.estimate_cost()``, then ``default_cost``. For an LLM: prompt + max_tokens, what the KV
            cache must hold at the end.
        max_inflight_cost: the budget on the cost of records in flight (a ceiling; only a single record
            costlier than the whole budget exceeds it, and it then runs alone).
        max_inflight: most records in flight at once.
        max_queue_size: most records waiting for admission; ``submit``/``stream`` wait beyond it and the
            ``*_nowait`` forms raise :class:`~batching.QueueFullError`.
        order: ``"fifo"`` (strict: the head waits rather than be overtaken) or ``"length_aware"``: the
            cheapest record within the first ``lookahead`` goes first, unless the head has waited
            ``max_wait_s`` (aging), which then goes first and waits for room.
        peak_estimate: admit on LightLLM's peak estimate (:func:`peak_cost`) instead of the sum of final
            costs: records part-way through have not grown to their final size, and short ones free their
            tokens before long ones peak, so more fit. Needs each record's ``growth`` (tokens it may add
            while running: ``growth_estimator(record)`` or ``record.estimate_growth()``; 0 otherwise) and
            its progress (``progress_fn(output)`` -> tokens added so far; default: outputs yielded).
        max_queue_wait_s: shed load early: the ``*_nowait`` forms raise :class:`~batching.QueueFullError`
            when the records would have to wait longer than this for admission, estimated from what is queued
            ahead and the rate at which cost and records have been leaving the engine over the last
            ``RATE_WINDOW_S`` (no estimate, and no refusal, before anything has finished). A request that
            would miss its latency objective anyway is better refused at once (503 + Retry-After) than
            queued, where it also delays the ones behind it. ``None`` (default): only the queue size bounds.
        default_cost: the cost of a record with no other estimate.
        latency_samples: how many recent per-record latencies the percentiles in ``stats`` cover.
    """

    RATE_WINDOW_S = 10.0

    _cost_methods: tuple[str, ...] = ("estimate_tokens", "estimate_cost")

    def __init__(
        self,
        process_fn: StreamFn[RecordT, ResultT],
        *,
        cost_estimator: CostEstimatorFn[RecordT] | None = None,
        max_inflight_cost: int = 32_000,
        max_inflight: int = 256,
        max_queue_size: int = 5_000,
        order: Literal["fifo", "length_aware"] = "fifo",
        lookahead: int = 64,
        max_wait_s: float = 2.0,
        peak_estimate: bool = False,
        growth_estimator: CostEstimatorFn[RecordT] | None = None,
        progress_fn: Callable[[ResultT], int] | None = None,
        max_queue_wait_s: float | None = None,
        default_cost: int = 1,
        latency_samples: int = 10_000,
    ) -> None:
        if not callable(process_fn):
            raise TypeError(f"process_fn must be callable, got {process_fn!r}")
        for name, fn in (("cost_estimator", cost_estimator), ("growth_estimator", growth_estimator)):
            if fn is not None and not callable(fn):
                raise TypeError(f"{name} must be callable or None, got {fn!r}")
        if order not in ("fifo", "length_aware"):
            raise ValueError(f"order must be 'fifo' or 'length_aware', got {order!r}")
        if isinstance(max_wait_s, bool) or not isinstance(max_wait_s, (int, float)) or not max_wait_s >= 0:
            raise ValueError(f"max_wait_s must be a number >= 0, got {max_wait_s!r}")
        if max_queue_wait_s is not None and (
            isinstance(max_queue_wait_s, bool)
            or not isinstance(max_queue_wait_s, (int, float))
            or max_queue_wait_s <= 0
        ):
            raise ValueError(f"max_queue_wait_s must be a number > 0 or None, got {max_queue_wait_s!r}")
        self._max_queue_wait = max_queue_wait_s
        self._process_fn = process_fn
        self._cost_estimator = cost_estimator
        self._growth_estimator = growth_estimator
        self._progress_fn = progress_fn
        self._budget = _positive_int("max_inflight_cost", max_inflight_cost)
        self._max_inflight = _positive_int("max_inflight", max_inflight)
        self._max_queue_size = _positive_int("max_queue_size", max_queue_size)
        self._order = order
        self._lookahead = _positive_int("lookahead", lookahead)
        self._max_wait = float(max_wait_s)
        self._peak = bool(peak_estimate)
        self._default_cost = _check_cost(default_cost, "default_cost")
        self._stats = StatsRecorder(_positive_int("latency_samples", latency_samples))

        self._state = _IDLE
        self._queue: deque[_Ticket] = deque()
        self._queued_cost = 0
        self._running: set[_Ticket] = set()
        self._inflight_cost = 0
        self._admission = Admission(self._max_queue_size, self._queue.__len__)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._drained: asyncio.Future | None = None
        self._clock = time.monotonic
        self._submitted = 0
        self._leaving: deque[tuple[float, int]] = deque()  # (when, cost) of records that left the engine

    # -- Public API ----------------------------------------------------------------------------------

    @property
    def is_running(self) -> bool:
        """Whether the batcher accepts work or is draining it (``start`` called, ``stop`` not finished)."""
        return self._state is not _IDLE

    @property
    def budget(self) -> int:
        """The in-flight cost budget (``max_inflight_cost``)."""
        return self._budget

    @property
    def inflight_cost(self) -> int:
        """The summed cost of the records in flight now."""
        return self._inflight_cost

    @property
    def stats(self) -> BatchStats:
        """A fresh :class:`BatchStats` snapshot. Each admitted record counts as a batch of one."""
        return self._stats.snapshot(
            len(self._queue), self._queued_cost, len(self._running), self._inflight_cost, self._budget, self._submitted
        )

    async def start(self) -> None:
        """Start accepting records on the running event loop (no background task is needed).

        Raises:
            RuntimeError: if the batcher is already running.
        """
        if self._state is not _IDLE:
            raise RuntimeError(f"{type(self).__name__} is already running; call stop() before start()")
        self._loop = asyncio.get_running_loop()
        self._clock = self._loop.time
        self._drained = None
        self._state = _RUNNING
        self._stats.start()

    async def stop(self, timeout: float | None = None) -> None:
        """Graceful shutdown: run everything queued and in flight to its end, then stop.

        Producers still waiting for queue room get :class:`~batching.BatcherStoppedError`. With ``timeout``,
        what has not finished in time is cancelled and ends with :class:`~batching.BatcherStoppedError`.
        """
        if self._state is _IDLE:
            return
        if self._state is _RUNNING:
            self._state = _STOPPING
            self._admission.close(BatcherStoppedError(f"{type(self).__name__} is stopping and accepts no new records"))
        if self._queue or self._running:
            self._drained = self._loop.create_future()
            try:
                await asyncio.wait_for(asyncio.shield(self._drained), timeout)
            except asyncio.TimeoutError:
                logger.warning("%s: stop() timed out after %ss; cancelling the rest", type(self).__name__, timeout)
                error = BatcherStoppedError("the batcher was stopped before this record finished")
                running = list(self._running)  # withdrawing them empties the set: keep their tasks to await
                # The queue from its back first, so that the room a withdrawn head leaves admits nobody behind
                # it; then the running records, once nothing is left to admit into the room they free.
                for ticket in [*reversed(self._queue), *running]:
                    self._withdraw(ticket, error)
                await asyncio.gather(*(t.task for t in running if t.task), return_exceptions=True)
        self._state = _IDLE
        self._stats.stop()

    async def submit(self, record: RecordT, *, estimated_cost: int | None = None) -> asyncio.Future[ResultT]:
        """Queue one record; returns the future of its result (its last output). Waits while the queue is
        full. Cancelling the future withdraws the record."""
        ticket = await self._enqueue(record, estimated_cost, self._new_future(), wait=True)
        return ticket.sink

    def submit_nowait(self, record: RecordT, *, estimated_cost: int | None = None) -> asyncio.Future[ResultT]:
        """Like :meth:`submit`, but raises :class:`~batching.QueueFullError` instead of waiting."""
        return self._enqueue_nowait([record], [estimated_cost], stream=False)[0]

    def submit_batch_nowait(
        self, records: Sequence[RecordT], *, estimated_cost: Sequence[int | None] | None = None
    ) -> list[asyncio.Future[ResultT]]:
        """All or nothing: one future per record, or :class:`~batching.QueueFullError` unless all fit."""
        return self._enqueue_nowait(records, self._explicit(records, estimated_cost), stream=False)

    async def stream(self, record: RecordT, *, estimated_cost: int | None = None) -> RecordStream[ResultT]:
        """Queue one record; returns its :class:`RecordStream`. Waits while the queue is full."""
        ticket = await self._enqueue(record, estimated_cost, None, wait=True)
        return ticket.sink

    def stream_nowait(self, record: RecordT, *, estimated_cost: int | None = None) -> RecordStream[ResultT]:
        """Like :meth:`stream`, but raises :class:`~batching.QueueFullError` instead of waiting."""
        return self._enqueue_nowait([record], [estimated_cost], stream=True)[0]

    def stream_batch_nowait(
        self, records: Sequence[RecordT], *, estimated_cost: Sequence[int | None] | None = None
    ) -> list[RecordStream[ResultT]]:
        """All or nothing: one stream per record, or :class:`~batching.QueueFullError` unless all fit."""
        return self._enqueue_nowait(records, self._explicit(records, estimated_cost), stream=True)

    async def __aenter__(self) -> ContinuousBatcher[RecordT, ResultT]:
        await self.start()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.stop()

    # -- Submission ----------------------------------------------------------------------------------

    def _refuse(self) -> None:
        if self._state is _STOPPING:
            raise BatcherStoppedError(f"{type(self).__name__} is stopping and accepts no new records")
        if self._state is not _RUNNING:
            raise RuntimeError(
                f"{type(self).__name__} is not running: call `await batcher.start()` first, or use `async with`"
            )

    def _new_future(self) -> asyncio.Future:
        return self._loop.create_future() if self._loop is not None else asyncio.get_running_loop().create_future()

    @staticmethod
    def _explicit(records: Sequence[Any], costs: Sequence[int | None] | None) -> list[int | None]:
        if costs is None:
            return [None] * len(records)
        if len(costs) != len(records):
            raise ValueError(f"estimated_cost has {len(costs)} entries but records has {len(records)}; they must match")
        return list(costs)

    def _cost_of(self, record: Any, explicit: Any) -> int:
        if explicit is not None:
            return _check_cost(explicit, "estimated_cost")
        if self._cost_estimator is not None:
            return _check_cost(self._cost_estimator(record), "cost_estimator")
        for name in self._cost_methods:
            method = getattr(record, name, None)
            if callable(method):
                return _check_cost(method(), f"{type(record).__name__}.{name}()")
        return self._default_cost

    def _growth_of(self, record: Any, cost: int) -> int:
        if not self._peak:
            return 0
        if self._growth_estimator is not None:
            growth = _check_cost(self._growth_estimator(record), "growth_estimator")
        else:
            method = getattr(record, "estimate_growth", None)
            growth = _check_cost(method(), f"{type(record).__name__}.estimate_growth()") if callable(method) else 0
        return min(growth, cost)

    def _make(self, record: Any, explicit: Any, sink: asyncio.Future | None) -> _Ticket:
        cost = self._cost_of(record, explicit)
        ticket = _Ticket(record, cost, self._growth_of(record, cost), sink, 0.0)
        if sink is None:
            ticket.sink = RecordStream(lambda: self._withdraw(ticket, None))
        else:
            sink.add_done_callback(lambda future: future.cancelled() and self._withdraw(ticket, None))
        return ticket

    async def _enqueue(self, record: Any, explicit: Any, sink: asyncio.Future | None, wait: bool) -> _Ticket:
        self._refuse()
        ticket = self._make(record, explicit, sink)
        if not self._admission.has_room():
            await self._admission.wait(self._loop)
            if self._state is not _RUNNING:
                self._admission.grant()  # the slot we were given goes to the next in line
                self._refuse()
        self._push(ticket)
        self._pump()
        return ticket

    def _enqueue_nowait(self, records: Sequence[Any], explicit: list[Any], stream: bool) -> list[Any]:
        self._refuse()
        if isinstance(records, (str, bytes)) or not isinstance(records, Sequence):
            raise TypeError(f"records must be a sequence, got {type(records).__name__}")
        tickets = [self._make(r, c, None if stream else self._new_future()) for r, c in zip(records, explicit)]
        if not self._admission.has_room(len(tickets)):
            for ticket in tickets:  # nobody holds these yet: end them quietly
                self._end(ticket, BatcherStoppedError("not queued"), count=False)
            raise QueueFullError(
                f"queue full: {len(self._queue)} of max_queue_size={self._max_queue_size} records waiting, "
                f"{len(tickets)} more asked for"
            )
        wait = self._expected_wait(tickets)
        if wait > (self._max_queue_wait or math.inf):
            for ticket in tickets:
                self._end(ticket, BatcherStoppedError("not queued"), count=False)
            raise QueueFullError(
                f"overloaded: about {wait:.1f} s of waiting for admission expected, "
                f"over max_queue_wait_s={self._max_queue_wait:g}"
            )
        for ticket in tickets:
            self._push(ticket)
        self._pump()
        return [ticket.sink for ticket in tickets]

    def _expected_wait(self, tickets: list[_Ticket]) -> float:
        """Seconds until ``tickets`` would be admitted behind the queue, from the recent leaving rate."""
        if self._max_queue_wait is None or not self._running:
            return 0.0
        leaving = self._leaving
        horizon = self._clock() - self.RATE_WINDOW_S
        while leaving and leaving[0][0] < horizon:
            leaving.popleft()
        cost_over = self._queued_cost + sum(t.cost for t in tickets) - (self._budget - self._inflight_cost)
        count_over = len(self._queue) + len(tickets) - (self._max_inflight - len(self._running))
        if cost_over <= 0 and count_over <= 0:
            return 0.0
        if not leaving:
            return 0.0  # nothing has finished lately: no basis for an estimate
        span = max(self._clock() - leaving[0][0], 1e-3)
        cost_rate = sum(cost for _, cost in leaving) / span
        count_rate = len(leaving) / span
        return max(cost_over / cost_rate if cost_rate > 0 else 0.0, count_over / count_rate)

    def _push(self, ticket: _Ticket) -> None:
        self._submitted += 1
        ticket.enqueued_at = self._clock()
        self._queue.append(ticket)
        self._queued_cost += ticket.cost

    # -- Admission: the budget math, in one place ------------------------------------------------------

    def _fits(self, ticket: _Ticket) -> bool:
        if not self._running:
            return True  # an idle engine takes anything, even a record costlier than the whole budget
        if len(self._running) >= self._max_inflight:
            return False
        if self._peak:
            return peak_cost([t.held() for t in self._running] + [ticket.held()]) <= self._budget
        return self._inflight_cost + ticket.cost <= self._budget

    def _next(self) -> int | None:
        """The queue index of the record to admit next, or None while it must wait for room."""
        queue = self._queue
        if self._order == "fifo" or self._clock() - queue[0].enqueued_at >= self._max_wait:
            return 0 if self._fits(queue[0]) else None
        window = min(self._lookahead, len(queue))
        index = min(range(window), key=lambda i: queue[i].cost)  # ties: the older one
        return index if self._fits(queue[index]) else None

    def _pump(self) -> None:
        """Admit queued records while they fit; called whenever a record arrives, finishes or leaves."""
        queue = self._queue
        admitted = False
        while queue:
            index = self._next()
            if index is None:
                break
            ticket = queue[index]
            del queue[index]
            self._queued_cost -= ticket.cost
            self._start(ticket)
            admitted = True
        if admitted:
            self._admission.grant()
        if self._drained is not None and not queue and not self._running and not self._drained.done():
            self._drained.set_result(None)

    def _start(self, ticket: _Ticket) -> None:
        ticket.state = _ADMITTED
        ticket.started_at = now = self._clock()
        self._running.add(ticket)
        self._inflight_cost += ticket.cost
        self._stats.admitted(ticket.cost, now - ticket.enqueued_at, self._inflight_cost / self._budget)
        ticket.task = self._loop.create_task(self._run(ticket))

    def _release(self, ticket: _Ticket) -> None:
        """Return a running record's cost to the budget (once) and admit what now fits."""
        if ticket.state != _ADMITTED:
            return
        ticket.state = _DONE
        self._running.discard(ticket)
        self._inflight_cost -= ticket.cost
        if self._max_queue_wait is not None:
            self._leaving.append((self._clock(), ticket.cost))
        self._stats.released(self._inflight_cost / self._budget)
        self._pump()

    # -- Running one record ----------------------------------------------------------------------------

    async def _run(self, ticket: _Ticket) -> None:
        error: BaseException | None = None
        try:
            outputs = self._process_fn(ticket.record)
            if hasattr(outputs, "__anext__"):
                try:
                    async for output in outputs:
                        self._output(ticket, output)
                finally:
                    if hasattr(outputs, "aclose"):
                        await outputs.aclose()
            else:
                self._output(ticket, await outputs)
            if ticket.last is _END:
                raise ValueError("process_fn produced no output for this record")
        except asyncio.CancelledError as exc:  # withdrawn (then already ended), or the engine aborted it
            error = BatchCancelledError("process_fn was cancelled (was the engine request aborted?)")
            error.__cause__ = exc
        except Exception as exc:
            error = exc
            logger.debug("record failed: %r", exc)
        self._end(ticket, error)

    def _output(self, ticket: _Ticket, output: Any) -> None:
        if not ticket.first_output:
            ticket.first_output = True
            self._stats.first_output(self._clock() - ticket.enqueued_at)
        ticket.last = output
        if self._peak:
            ticket.produced = self._progress_fn(output) if self._progress_fn is not None else ticket.produced + 1
        if isinstance(ticket.sink, RecordStream):
            ticket.sink._push(output)

    def _end(self, ticket: _Ticket, error: BaseException | None, count: bool = True) -> None:
        """Resolve the record's future or end its stream (exactly once), then free its cost."""
        sink = ticket.sink
        if isinstance(sink, RecordStream):
            ended = not sink.done
            sink._end(error)
        else:
            ended = not sink.done()
            if ended:
                if error is None:
                    sink.set_result(ticket.last)
                else:
                    sink.set_exception(error)
                    sink.exception()  # a withdrawn record's error is retrieved: no "never retrieved" warning
            elif count and sink.cancelled() and ticket.state == _ADMITTED:
                # Its caller cancelled the future, but the record ended before the done callback could
                # withdraw it (that callback then finds it done): count the withdrawal here, once.
                self._stats.cancelled += 1
        if count and ended:
            self._stats.record_finished(error is not None, self._clock() - ticket.enqueued_at)
        self._release(ticket)

    def _withdraw(self, ticket: _Ticket, error: BaseException | None) -> None:
        """The caller went away (or ``stop`` timed out): leave the queue, or cancel the run; free the cost."""
        if ticket.state == _QUEUED:
            if ticket not in self._queue:
                return  # never queued (refused all-or-nothing)
            self._queue.remove(ticket)
            self._queued_cost -= ticket.cost
            ticket.state = _DONE
            self._stats.cancelled += 1
            # As when withdrawn while running: a stream's other readers get an error, not a CancelledError
            # that would end their own tasks as if they had been cancelled.
            self._end(ticket, error or BatcherStoppedError("withdrawn by its caller"), count=False)
            self._admission.grant()
            self._pump()
        elif ticket.state == _ADMITTED:
            if ticket.task is not None:
                ticket.task.cancel()
            if error is None:
                self._stats.cancelled += 1
            self._end(ticket, error or BatcherStoppedError("withdrawn by its caller"), count=error is not None)

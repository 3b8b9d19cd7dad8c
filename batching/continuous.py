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
import math
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import Any, Generic, Literal, NoReturn

from .base import RUNNING, check_cost, positive_int
from .errors import BatcherStoppedError, QueueFullError
from .protocols import CostEstimatorFn, RecordT, ResultT
from .record_stream import RecordStream
from .scheduling import RecordScheduler, Ticket, peak_cost
from .stats import AdmissionStats

__all__ = ["ContinuousBatcher", "RecordStream", "peak_cost"]

StreamFn = Callable[[RecordT], AsyncIterator[ResultT] | Awaitable[ResultT]]
"""``(record) -> outputs``: an async generator (each output is streamed; the last is the result) or an
``async def`` returning the one result."""


class ContinuousBatcher(RecordScheduler, Generic[RecordT, ResultT]):
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
        super().__init__(
            process_fn,
            cost_estimator,
            max_queue_size=max_queue_size,
            default_cost=default_cost,
            latency_samples=latency_samples,
        )
        if growth_estimator is not None and not callable(growth_estimator):
            raise TypeError(f"growth_estimator must be callable or None, got {growth_estimator!r}")
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
        self._growth_estimator = growth_estimator
        self._progress_fn = progress_fn
        self._budget = positive_int("max_inflight_cost", max_inflight_cost)
        self._max_inflight = positive_int("max_inflight", max_inflight)
        self._order = order
        self._lookahead = positive_int("lookahead", lookahead)
        self._max_wait = float(max_wait_s)
        self._peak = bool(peak_estimate)

        self._running = set()
        self._inflight_cost = 0
        self._drained = None
        self._leaving = deque()

    # -- Public API ----------------------------------------------------------------------------------

    @property
    def budget(self) -> int:
        """The in-flight cost budget (``max_inflight_cost``)."""
        return self._budget

    @property
    def inflight_cost(self) -> int:
        """The summed cost of the records in flight now."""
        return self._inflight_cost

    @property
    def stats(self) -> AdmissionStats:
        """A fresh :class:`~batching.AdmissionStats` snapshot; ``stats.to_dict()`` gives a plain dict for export."""
        return self._stats.snapshot(
            len(self._queue), self._queued_cost, len(self._running), self._inflight_cost, self._budget
        )

    async def submit(self, record: RecordT, *, estimated_cost: int | None = None) -> asyncio.Future[ResultT]:
        """Queue one record; returns the future of its result (its last output). Waits while the queue is
        full. Cancelling the future withdraws the record."""
        ticket = await self._enqueue(record, estimated_cost, self._new_future())
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
        ticket = await self._enqueue(record, estimated_cost, None)
        return ticket.sink

    def stream_nowait(self, record: RecordT, *, estimated_cost: int | None = None) -> RecordStream[ResultT]:
        """Like :meth:`stream`, but raises :class:`~batching.QueueFullError` instead of waiting."""
        return self._enqueue_nowait([record], [estimated_cost], stream=True)[0]

    def stream_batch_nowait(
        self, records: Sequence[RecordT], *, estimated_cost: Sequence[int | None] | None = None
    ) -> list[RecordStream[ResultT]]:
        """All or nothing: one stream per record, or :class:`~batching.QueueFullError` unless all fit."""
        return self._enqueue_nowait(records, self._explicit(records, estimated_cost), stream=True)

    # -- Lifecycle -----------------------------------------------------------------------------------

    def _launch(self, loop: asyncio.AbstractEventLoop) -> None:
        self._drained = None  # nothing to start: each admitted record runs as its own task

    # -- Submission ----------------------------------------------------------------------------------

    def _new_future(self) -> asyncio.Future:
        return self._loop.create_future() if self._loop is not None else asyncio.get_running_loop().create_future()

    def _explicit(self, records: Sequence[Any], costs: Sequence[int | None] | None) -> list[int | None]:
        self._check_cost_count(records, costs)
        return [None] * len(records) if costs is None else list(costs)

    def _growth_of(self, record: Any, cost: int) -> int:
        if not self._peak:
            return 0
        if self._growth_estimator is not None:
            growth = check_cost(self._growth_estimator(record), "growth_estimator")
        else:
            method = getattr(record, "estimate_growth", None)
            growth = check_cost(method(), f"{type(record).__name__}.estimate_growth()") if callable(method) else 0
        return min(growth, cost)

    def _make(self, record: Any, explicit: Any, sink: asyncio.Future | None) -> Ticket:
        cost = self._cost_of(record, explicit)
        ticket = Ticket(record, cost, self._growth_of(record, cost), sink, 0.0)
        if sink is None:
            ticket.sink = RecordStream(lambda: self._withdraw(ticket, None))
        else:
            sink.add_done_callback(lambda future: future.cancelled() and self._withdraw(ticket, None))
        return ticket

    async def _enqueue(self, record: Any, explicit: Any, sink: asyncio.Future | None) -> Ticket:
        if self._state is not RUNNING:
            self._refuse()
        ticket = self._make(record, explicit, sink)
        if not self._admission.has_room():
            await self._wait_for_room()
        self._push(ticket)
        self._pump()
        return ticket

    def _enqueue_nowait(self, records: Sequence[Any], explicit: list[Any], stream: bool) -> list[Any]:
        if self._state is not RUNNING:
            self._refuse()
        if isinstance(records, (str, bytes)) or not isinstance(records, Sequence):
            raise TypeError(f"records must be a sequence, got {type(records).__name__}")
        tickets = [self._make(r, c, None if stream else self._new_future()) for r, c in zip(records, explicit)]
        if not self._admission.has_room(len(tickets)):
            self._turn_away(
                tickets,
                f"queue full: {len(self._queue)} of max_queue_size={self._max_queue_size} records waiting, "
                f"{len(tickets)} more asked for",
            )
        wait = self._expected_wait(tickets)
        if wait > (self._max_queue_wait or math.inf):
            self._turn_away(
                tickets,
                f"overloaded: about {wait:.1f} s of waiting for admission expected, "
                f"over max_queue_wait_s={self._max_queue_wait:g}",
            )
        for ticket in tickets:
            self._push(ticket)
        self._pump()
        return [ticket.sink for ticket in tickets]

    def _turn_away(self, tickets: list[Ticket], message: str) -> NoReturn:
        """Refuse ``tickets`` all together with :class:`~batching.QueueFullError`."""
        for ticket in tickets:  # nobody holds these yet: end them quietly
            self._end(ticket, BatcherStoppedError("not queued"), count=False)
        raise QueueFullError(message)

    def _expected_wait(self, tickets: list[Ticket]) -> float:
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

    def _push(self, ticket: Ticket) -> None:
        self._stats.submitted += 1
        ticket.enqueued_at = self._clock()
        self._queue.append(ticket)
        self._queued_cost += ticket.cost

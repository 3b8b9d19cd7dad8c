"""The engine room of :class:`~batching.ContinuousBatcher`: which queued record starts next under the
budget (the budget math, in one place), running each admitted record as its own task, and ending it
exactly once, whether it finishes, fails or is withdrawn."""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any

from .base import BaseBatcher
from .errors import BatchCancelledError, BatcherStoppedError
from .record_stream import RecordStream
from .recorders import AdmissionRecorder

__all__ = ["RecordScheduler", "Ticket", "peak_cost"]

logger = logging.getLogger(__name__)

_QUEUED, _ADMITTED, _DONE = 0, 1, 2
_NO_OUTPUT = object()


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


class Ticket:
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
        self.last: Any = _NO_OUTPUT

    def held(self) -> tuple[int, int]:
        """(tokens held now, tokens it may still add), for :func:`peak_cost`."""
        produced = min(self.produced, self.growth)
        return self.cost - self.growth + produced, self.growth - produced


class RecordScheduler(BaseBatcher):
    """Admits queued tickets while they fit and runs them; :class:`~batching.ContinuousBatcher` adds the
    constructor, the submission API and the load shedding."""

    _recorder_type = AdmissionRecorder
    _stats: AdmissionRecorder
    _queue: deque[Ticket]
    _process_fn: Callable[[Any], Any]
    _budget: int
    _max_inflight: int
    _order: str
    _lookahead: int
    _max_wait: float
    _peak: bool
    _progress_fn: Callable[[Any], int] | None
    _max_queue_wait: float | None
    _running: set[Ticket]
    _inflight_cost: int
    _drained: asyncio.Future | None  # set by stop(): resolved once nothing is queued or running
    _leaving: deque[tuple[float, int]]  # (when, cost) of records that left the engine

    async def _drain(self, timeout: float | None) -> None:
        """Run everything queued and in flight to its end; past ``timeout``, withdraw what is left."""
        if self._queue or self._running:
            if self._drained is None:  # a second stop() waits on the same future as the first
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

    # -- Admission: the budget math, in one place ------------------------------------------------------

    def _fits(self, ticket: Ticket) -> bool:
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

    def _start(self, ticket: Ticket) -> None:
        ticket.state = _ADMITTED
        ticket.started_at = now = self._clock()
        self._running.add(ticket)
        self._inflight_cost += ticket.cost
        self._stats.admit(ticket.cost, now - ticket.enqueued_at, self._inflight_cost / self._budget, len(self._running))
        ticket.task = self._loop.create_task(self._run(ticket))

    def _release(self, ticket: Ticket) -> None:
        """Return a running record's cost to the budget (once) and admit what now fits."""
        if ticket.state != _ADMITTED:
            return
        ticket.state = _DONE
        self._running.discard(ticket)
        self._inflight_cost -= ticket.cost
        if self._max_queue_wait is not None:
            self._leaving.append((self._clock(), ticket.cost))
        self._stats.release(self._inflight_cost / self._budget, len(self._running))
        self._pump()

    # -- Running one record ----------------------------------------------------------------------------

    async def _run(self, ticket: Ticket) -> None:
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
            if ticket.last is _NO_OUTPUT:
                raise ValueError("process_fn produced no output for this record")
        except asyncio.CancelledError as exc:  # withdrawn (then already ended), or the engine aborted it
            error = BatchCancelledError("process_fn was cancelled (was the engine request aborted?)")
            error.__cause__ = exc
        except Exception as exc:
            error = exc
            logger.debug("record failed: %r", exc)
        self._end(ticket, error)

    def _output(self, ticket: Ticket, output: Any) -> None:
        if not ticket.first_output:
            ticket.first_output = True
            self._stats.first_output(self._clock() - ticket.enqueued_at)
        ticket.last = output
        if self._peak:
            ticket.produced = self._progress_fn(output) if self._progress_fn is not None else ticket.produced + 1
        if isinstance(ticket.sink, RecordStream):
            ticket.sink._push(output)

    def _end(self, ticket: Ticket, error: BaseException | None, count: bool = True) -> None:
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
            self._stats.finish(error is not None, self._clock() - ticket.enqueued_at)
        self._release(ticket)

    def _withdraw(self, ticket: Ticket, error: BaseException | None) -> None:
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

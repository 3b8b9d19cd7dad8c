"""The engine room of :class:`~batching.ContinuousBatcher`: which queued record starts next under the
budget (the budget math, in one place: :meth:`RecordScheduler._fits`), running each admitted record as its
own task, and ending it exactly once, whether it finishes, fails or is withdrawn. Which records are next
in order (priority, aging, fair share between tenants) is the queue's part: :mod:`batching.priorities`."""

from __future__ import annotations

import asyncio
import logging
import math
from collections.abc import Callable
from itertools import islice
from operator import attrgetter
from typing import Any

from .base import BaseBatcher
from .errors import BatchCancelledError, BatcherStoppedError
from .groups import GroupLimit
from .priorities import TicketQueue
from .record_stream import RecordStream
from .recorders import AdmissionRecorder
from .tickets import ADMITTED, DONE, NO_OUTPUT, QUEUED, Ticket, peak_cost

__all__ = ["RecordScheduler", "Ticket", "peak_cost"]

logger = logging.getLogger(__name__)

_cost = attrgetter("cost")


class RecordScheduler(BaseBatcher):
    """Admits queued tickets while they fit and runs them; :class:`~batching.ContinuousBatcher` adds the
    constructor, the submission API and the load shedding."""

    _recorder_type = AdmissionRecorder
    _stats: AdmissionRecorder
    _queue: TicketQueue
    _process_fn: Callable[[Any], Any]
    _budget: int
    _max_inflight: int
    _order: str
    _lookahead: int
    _max_wait: float
    _peak: bool
    _progress_fn: Callable[[Any], int] | None
    _share: float  # low_priority_share
    _step_budget: int | None  # low_priority_step_budget
    _share_hold: float  # share_hold_s
    _share_timer: asyncio.TimerHandle | None  # a pump due when a share hold ends
    _running: set[Ticket]
    _groups: GroupLimit  # max_groups: the groups in flight, and the drain under way
    _block_cost: int  # what one of a record's prefix blocks costs
    _held: dict[Any, int]  # prefix blocks held by records in flight: how many of them hold each
    _inflight_cost: int
    _drained: asyncio.Future | None  # set by stop(): resolved once nothing is queued or running
    _halted: bool  # stop() timed out: nothing more is admitted

    def _launch(self, loop: asyncio.AbstractEventLoop) -> None:
        self._drained = None  # nothing to start: each admitted record runs as its own task
        self._halted = False

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
                self._halted = True  # the room the withdrawn leave admits nobody: the queue goes first
                for ticket in [*self._queue, *running]:
                    self._withdraw(ticket, error)
                await asyncio.gather(*(t.task for t in running if t.task), return_exceptions=True)
        if self._share_timer is not None:
            self._share_timer.cancel()
            self._share_timer = None

    # -- Admission: the budget math, in one place ------------------------------------------------------

    def _fits(self, ticket: Ticket) -> bool:
        """Whether ``ticket`` may start now: the in-flight count cap, the share cap of lower priorities, and
        the cost budget (summed, or LightLLM's peak estimate); an idle engine takes anything."""
        if not self._running:
            return True  # an idle engine takes anything, even a record costlier than the whole budget
        if len(self._running) >= self._max_inflight:
            return False
        if not self._groups.fits(ticket.group):
            return False
        if self._capped and not self._within_share(ticket):
            return False
        if self._peak:
            return peak_cost([t.held() for t in self._running] + [ticket.held()]) <= self._budget
        return self._inflight_cost + ticket.cost - self._shared(ticket) <= self._budget

    def _shared(self, ticket: Ticket) -> int:
        """The cost of ``ticket``'s leading prefix blocks that records in flight hold (besides itself, once it
        has released them): what it adds to, or leaves in, the cost in flight less than its own cost."""
        held, count = self._held, 0
        for key in ticket.blocks:
            if key not in held:
                break
            count += 1
        return min(ticket.cost, count * self._block_cost)

    @property
    def _capped(self) -> bool:
        """Whether lower priorities are held back at all while higher ones are about."""
        return self._share < 1.0 or self._step_budget is not None

    def _within_share(self, ticket: Ticket) -> bool:
        """The share cap: while a record of a higher priority is queued or in flight (or left within
        ``share_hold_s``), the records of ``ticket``'s priority and lower ones may hold together at most
        ``low_priority_share`` of the budget and of ``max_inflight``, and put at most ``low_priority_step_budget``
        into each of the engine's steps, unless none of them is in flight."""
        now = self._clock()
        until = self._queue.share_held_until(ticket.priority, now, self._share_hold)
        if until <= now:
            return True
        cost, count, step = self._queue.inflight_from(ticket.priority)
        if not count:
            return True  # a lone record always may run: lower priorities never starve
        budget = self._step_budget
        if (
            cost + ticket.cost <= self._share * self._budget
            and count + 1 <= self._share * self._max_inflight
            and (budget is None or step + ticket.step_load() <= budget)
        ):
            return True
        if until < math.inf:  # the hold ends without an event of its own: look again then
            timer = self._share_timer
            if timer is None or timer.when() > until:
                if timer is not None:
                    timer.cancel()
                self._share_timer = self._loop.call_at(until, self._hold_ended)
        return False

    def _hold_ended(self) -> None:
        self._share_timer = None
        self._pump()

    def _next(self) -> Ticket | None:
        """The record to admit next, or None while it must wait for room (it is not skipped). From the
        queue's candidates (see :meth:`TicketQueue.candidates`): the oldest, or with ``length_aware`` the
        cheapest of the first ``lookahead`` unless the oldest has waited ``max_wait_s``. A record the share cap
        holds back (one of a lower priority that aging put first) does not hold back the higher priorities the
        cap keeps room for: the best of those is chosen instead. Nor does one whose group must wait for another to
        leave (``max_groups``) hold back the records of groups in flight behind it; once it has waited
        ``max_wait_s``, the group in flight that leaves soonest drains for it (:class:`~.groups.GroupLimit`)."""
        above: int | None = None
        while True:
            candidates = self._queue.candidates(self._clock, above)
            if candidates is None:
                return None
            head = next(iter(candidates))
            if self._order == "fifo" or self._clock() - head.enqueued_at >= self._max_wait:
                ticket = head
            else:
                ticket = min(islice(candidates, self._lookahead), key=_cost)  # ties: the older one
            groups = self._groups
            if not groups.fits(ticket.group):
                if self._clock() - ticket.enqueued_at >= self._max_wait:
                    groups.start_drain(ticket.group, self._running)
                if not groups.fits(ticket.group):  # others pass it, except a draining group's records
                    ticket = next((t for t in candidates if groups.fits(t.group)), ticket)
            if self._capped and self._running and not self._within_share(ticket):
                above = ticket.priority
                continue
            return ticket if self._fits(ticket) else None

    def _pump(self) -> None:
        """Admit queued records while they fit; called whenever a record arrives, finishes or leaves."""
        queue = self._queue
        admitted = False
        while queue and not self._halted:
            ticket = self._next()
            if ticket is None:
                break
            queue.admit(ticket)
            self._queued_cost -= ticket.cost
            self._start(ticket)
            admitted = True
        if admitted:
            self._admission.grant()
        if self._drained is not None and not queue and not self._running and not self._drained.done():
            self._drained.set_result(None)

    def _start(self, ticket: Ticket) -> None:
        ticket.state = ADMITTED
        ticket.started_at = now = self._clock()
        self._running.add(ticket)
        self._groups.enter(ticket.group)
        self._inflight_cost += ticket.cost - self._shared(ticket)
        held = self._held
        for key in ticket.blocks:
            held[key] = held.get(key, 0) + 1
        occupancy = self._inflight_cost / self._budget
        self._stats.admit(ticket.cost, now - ticket.enqueued_at, occupancy, len(self._running), ticket.tenant)
        ticket.task = self._loop.create_task(self._run(ticket))
        if isinstance(ticket.sink, RecordStream):
            ticket.sink._admit()

    def _release(self, ticket: Ticket) -> None:
        """Return a running record's cost to the budget (once) and admit what now fits."""
        if ticket.state != ADMITTED:
            return
        ticket.state = DONE
        self._running.discard(ticket)
        self._groups.leave(ticket.group)
        held = self._held
        for key in ticket.blocks:
            left = held[key] - 1
            if left:
                held[key] = left
            else:
                del held[key]
        self._inflight_cost -= ticket.cost - self._shared(ticket)  # what others still hold stays counted
        now = self._clock()
        self._queue.release(ticket, now)
        self._drain_rate.note(now, 1, ticket.cost)
        self._stats.release(self._inflight_cost / self._budget, len(self._running))
        self._pump()

    def _backlog(self, cost: int, count: int) -> tuple[int, int]:
        """(cost, records) that must leave the engine before ``cost``/``count`` more, queued behind
        everything queued now, would all be admitted."""
        if not self._running:
            return 0, 0  # nothing in flight, so nothing queued: they would be admitted at once
        free_cost = self._budget - self._inflight_cost
        free_count = self._max_inflight - len(self._running)
        return self._queued_cost + cost - free_cost, len(self._queue) + count - free_count

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
            if ticket.last is NO_OUTPUT:
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
            if ticket.state == ADMITTED:
                self._queue.first_output(ticket)
            ticket.first_output = True
            self._stats.first_output(self._clock() - ticket.enqueued_at)
            if self._step_budget is not None and self._queue:
                self._pump()  # its prompt has left the engine's steps: room for more within the step budget
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
            elif count and sink.cancelled() and ticket.state == ADMITTED:
                # Its caller cancelled the future, but the record ended before the done callback could
                # withdraw it (that callback then finds it done): count the withdrawal here, once.
                self._stats.cancelled += 1
        if count and ended:
            self._stats.finish(error is not None, self._clock() - ticket.enqueued_at)
        self._release(ticket)

    def _withdraw(self, ticket: Ticket, error: BaseException | None) -> None:
        """The caller went away (or ``stop`` timed out): leave the queue, or cancel the run; free the cost."""
        if ticket.state == QUEUED:
            if ticket not in self._queue:
                return  # never queued (refused all-or-nothing)
            self._queue.withdraw(ticket, self._clock())
            self._queued_cost -= ticket.cost
            ticket.state = DONE
            self._stats.cancelled += 1
            # As when withdrawn while running: a stream's other readers get an error, not a CancelledError
            # that would end their own tasks as if they had been cancelled.
            self._end(ticket, error or BatcherStoppedError("withdrawn by its caller"), count=False)
            self._admission.grant()
            self._pump()
        elif ticket.state == ADMITTED:
            if ticket.task is not None:
                ticket.task.cancel()
            if error is None:
                self._stats.cancelled += 1
            self._end(ticket, error or BatcherStoppedError("withdrawn by its caller"), count=error is not None)

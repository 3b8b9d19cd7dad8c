"""How a record enters :class:`~batching.ContinuousBatcher`: its ticket (cost, growth, priority, tenant, and
the future or stream it ends through), the wait for queue room or the all-or-nothing refusal with a
computed ``retry_after_s``, and the push onto the queue that admission then works from."""

from __future__ import annotations

import asyncio
import numbers
from collections.abc import Callable, Hashable, Sequence
from typing import Any, NoReturn

from .base import RUNNING, check_cost
from .errors import BatcherStoppedError
from .priorities import TicketQueue
from .record_stream import RecordStream
from .scheduling import RecordScheduler
from .tickets import Ticket

__all__ = ["RecordIntake"]


class RecordIntake(RecordScheduler):
    """Turns records into queued tickets (or refuses them); :class:`~batching.ContinuousBatcher` adds the
    constructor and the public submission API on top."""

    _growth_estimator: Callable[[Any], Any] | None
    _priority_fn: Callable[[Any], Any] | None
    _tenant_fn: Callable[[Any], Any] | None
    _group_fn: Callable[[Any], Any] | None
    _prefix_fn: Callable[[Any], Any] | None
    _fair: bool
    _aging: float | None
    _max_queue_wait: float | None
    _coalesce_fn: Callable[[Any, Any], Any] | None
    _stream_interval: float

    def _new_queue(self) -> TicketQueue:
        return TicketQueue(fair_share=self._fair, aging_s=self._aging)

    def _new_future(self) -> asyncio.Future:
        return self._loop.create_future() if self._loop is not None else asyncio.get_running_loop().create_future()

    def _explicit(self, records: Sequence[Any], costs: Sequence[int | None] | None) -> list[int | None]:
        self._check_cost_count(records, costs)
        return [None] * len(records) if costs is None else list(costs)

    def _growth_of(self, record: Any, cost: int) -> int:
        """Tokens it may add while it runs (what the peak estimate, the step budget and the choice of a group to
        drain need; 0 when none is on)."""
        if not self._peak and self._step_budget is None and self._groups.most is None:
            return 0
        if self._growth_estimator is not None:
            growth = check_cost(self._growth_estimator(record), "growth_estimator")
        else:
            method = getattr(record, "estimate_growth", None)
            growth = check_cost(method(), f"{type(record).__name__}.estimate_growth()") if callable(method) else 0
        return min(growth, cost)

    def _priority_of(self, record: Any) -> int:
        """``priority_fn(record)``, else ``record.priority``, else 0: an int (lower runs first)."""
        if self._priority_fn is not None:
            priority, source = self._priority_fn(record), "priority_fn"
        else:
            priority, source = getattr(record, "priority", 0), f"{type(record).__name__}.priority"
        if priority.__class__ is int:
            return priority
        if isinstance(priority, bool) or not isinstance(priority, numbers.Integral):
            raise TypeError(f"{source} must be an int (lower runs first), got {type(priority).__name__} {priority!r}")
        return int(priority)  # an IntEnum, a NumPy integer: a plain int

    def _blocks_of(self, record: Any) -> tuple[Hashable, ...]:
        """``prefix_fn(record)`` as a tuple of hashable keys (none without a ``prefix_fn``)."""
        if self._prefix_fn is None:
            return ()
        blocks = tuple(self._prefix_fn(record))
        try:
            hash(blocks)
        except TypeError:
            raise TypeError(f"prefix_fn must return hashable keys, got {blocks[:3]!r}...") from None
        return blocks

    def _tenant_of(self, record: Any) -> Hashable:
        """``tenant_fn(record)``, else ``record.tenant``, else None (one shared tenant): what fair share shares
        between, and what ``stats`` counts tokens by."""
        if self._tenant_fn is not None:
            tenant, source = self._tenant_fn(record), "tenant_fn"
        else:
            tenant, source = getattr(record, "tenant", None), f"{type(record).__name__}.tenant"
        try:
            hash(tenant)
        except TypeError:
            raise TypeError(f"{source} must be hashable or None, got {type(tenant).__name__} {tenant!r}") from None
        return tenant

    def _make(self, record: Any, explicit: Any, sink: asyncio.Future | None) -> Ticket:
        cost = self._cost_of(record, explicit)
        growth = self._growth_of(record, cost)
        group = self._group_fn(record) if self._group_fn is not None else None
        blocks = self._blocks_of(record)
        priority, tenant = self._priority_of(record), self._tenant_of(record)
        ticket = Ticket(record, cost, growth, sink, 0.0, priority, tenant, group, blocks)
        if sink is None:
            ticket.sink = RecordStream(lambda: self._withdraw(ticket, None), self._coalesce_fn, self._stream_interval)
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
        if self._max_queue_wait is not None:
            wait = self.expected_wait(sum(ticket.cost for ticket in tickets), len(tickets))
            if wait is not None and wait > self._max_queue_wait:
                self._turn_away(
                    tickets,
                    f"overloaded: about {wait:.1f} s of waiting for admission expected, "
                    f"over max_queue_wait_s={self._max_queue_wait:g}",
                    wait,
                )
        for ticket in tickets:
            self._push(ticket)
        self._pump()
        return [ticket.sink for ticket in tickets]

    def _turn_away(self, tickets: list[Ticket], message: str, wait: float | None = None) -> NoReturn:
        """Refuse ``tickets`` all together with :class:`~batching.QueueFullError`, its ``retry_after_s`` the
        wait expected for them now (``wait`` if already known)."""
        error = self._refusal(message, sum(ticket.cost for ticket in tickets), len(tickets), wait)
        for ticket in tickets:  # nobody holds these yet: end them quietly
            self._end(ticket, BatcherStoppedError("not queued"), count=False)
        raise error

    def _push(self, ticket: Ticket) -> None:
        self._stats.submitted += 1
        ticket.enqueued_at = self._clock()
        self._queue.push(ticket)
        self._queued_cost += ticket.cost

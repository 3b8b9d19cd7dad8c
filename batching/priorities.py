"""The queue of :class:`~batching.ContinuousBatcher`: queued records by priority and (with fair share) by
tenant, and what each priority holds in flight. It answers *which* queued records the next admission is
chosen from; whether the chosen record *fits* is the scheduler's budget math (:mod:`batching.scheduling`).

- **Priority**: lower numbers first (vLLM's meaning). **Aging**: a queued record's effective priority
  improves by one level for every ``aging_s`` seconds it has waited, so waiting work of a lower priority
  is never starved. The next record comes from the priority whose oldest record has the best effective
  priority (ties: the lower base priority); the oldest record of a priority is its best, as all share it.
- **Fair share** (VTC, Sheng et al., OSDI'24): within a priority, each tenant has a virtual counter of
  the cost admitted for it there, charged at admission; the tenant with the lowest counter goes next
  (ties: the older head). A tenant that becomes backlogged again (it had nothing queued or in flight at
  that priority) is lifted to at least the lowest counter of the backlogged tenants: idle time banks no
  credit. Counters live as long as their priority has anything queued or in flight.

Each (priority, tenant) queue is an ``OrderedDict`` used as an ordered set: O(1) push, withdrawal and
head, and the first ``lookahead`` records in O(lookahead). Choosing costs O(priorities with records
queued + tenants queued at the chosen one).
"""

from __future__ import annotations

import math
from collections import OrderedDict
from collections.abc import Callable, Hashable, Iterator

from .tickets import Ticket

__all__ = ["Level", "TicketQueue"]


class Level:
    """One priority: its queued tickets (all, and per tenant with fair share), its tenants' virtual counters
    and backlogs (records queued or in flight), and the cost, count and step load it holds in flight."""

    __slots__ = (
        "backlog",
        "counters",
        "inflight",
        "inflight_cost",
        "inflight_step",
        "priority",
        "queue",
        "queued_cost",
        "tenants",
    )

    def __init__(self, priority: int) -> None:
        self.priority = priority
        self.queue: OrderedDict[Ticket, None] = OrderedDict()
        self.queued_cost = 0
        self.inflight = 0
        self.inflight_cost = 0
        self.inflight_step = 0  # the step loads (Ticket.step_load) of its records in flight
        self.tenants: dict[Hashable, OrderedDict[Ticket, None]] = {}  # only tenants with records queued
        self.counters: dict[Hashable, int] = {}
        self.backlog: dict[Hashable, int] = {}


class TicketQueue:
    """Queued tickets by priority (and tenant), plus each priority's in-flight cost; see the module doc.

    The scheduler calls :meth:`push` when a record is queued, :meth:`candidates` to choose the next one,
    then :meth:`admit`, :meth:`first_output` when it produces its first output, and :meth:`release` when it
    leaves the engine, or :meth:`withdraw` when it leaves the queue unadmitted.
    """

    def __init__(self, fair_share: bool = False, aging_s: float | None = None) -> None:
        self._fair = fair_share
        self._aging = aging_s
        self._levels: dict[int, Level] = {}  # the priorities with anything queued or in flight
        self._left_at: dict[int, float] = {}  # priority -> when its last record left (its level emptied)
        self._len = 0
        self._seq = 0
        self._queued_by_tenant: dict[Hashable, int] = {}  # tenants with records queued (any priority)

    def __len__(self) -> int:
        return self._len

    def __contains__(self, ticket: Ticket) -> bool:
        level = self._levels.get(ticket.priority)
        return level is not None and ticket in level.queue

    def __iter__(self) -> Iterator[Ticket]:
        """The queued tickets, by priority, oldest first within one."""
        for priority in sorted(self._levels):
            yield from self._levels[priority].queue

    # -- Changes ---------------------------------------------------------------------------------------

    def push(self, ticket: Ticket) -> None:
        """Queue ``ticket`` behind the others of its priority (and tenant)."""
        level = self._levels.get(ticket.priority)
        if level is None:
            level = self._levels[ticket.priority] = Level(ticket.priority)
        ticket.seq = self._seq
        self._seq += 1
        level.queue[ticket] = None
        level.queued_cost += ticket.cost
        self._len += 1
        self._queued_by_tenant[ticket.tenant] = self._queued_by_tenant.get(ticket.tenant, 0) + 1
        if self._fair:
            tenant = ticket.tenant
            queue = level.tenants.get(tenant)
            if queue is None:
                queue = level.tenants[tenant] = OrderedDict()
            queue[ticket] = None
            backlog = level.backlog
            if tenant not in backlog:  # backlogged again: lift its counter, so idle time banks no credit
                floor = min((level.counters[t] for t in backlog), default=0)
                level.counters[tenant] = max(level.counters.get(tenant, 0), floor)
                backlog[tenant] = 0
            backlog[tenant] += 1

    def admit(self, ticket: Ticket) -> None:
        """``ticket`` leaves the queue for the engine: its priority holds its cost in flight, and its tenant's
        counter is charged its cost."""
        level = self._unqueue(ticket)
        level.inflight += 1
        level.inflight_cost += ticket.cost
        level.inflight_step += ticket.step_load()
        if self._fair:
            level.counters[ticket.tenant] += ticket.cost

    def first_output(self, ticket: Ticket) -> None:
        """An admitted ``ticket`` produced its first output: from now on it puts one token into each step. Call it
        before setting ``ticket.first_output``."""
        self._levels[ticket.priority].inflight_step += 1 - ticket.step_load()

    def withdraw(self, ticket: Ticket, now: float) -> None:
        """``ticket`` leaves the queue without being admitted (at ``now``)."""
        self._leave(self._unqueue(ticket), ticket, now)

    def release(self, ticket: Ticket, now: float) -> None:
        """An admitted ``ticket`` left the engine (at ``now``): its cost is no longer in flight."""
        level = self._levels[ticket.priority]
        level.inflight -= 1
        level.inflight_cost -= ticket.cost
        level.inflight_step -= ticket.step_load()
        self._leave(level, ticket, now)

    def _unqueue(self, ticket: Ticket) -> Level:
        level = self._levels[ticket.priority]
        del level.queue[ticket]
        level.queued_cost -= ticket.cost
        self._len -= 1
        left = self._queued_by_tenant[ticket.tenant] - 1
        if left:
            self._queued_by_tenant[ticket.tenant] = left
        else:
            del self._queued_by_tenant[ticket.tenant]
        if self._fair:
            queue = level.tenants[ticket.tenant]
            del queue[ticket]
            if not queue:
                del level.tenants[ticket.tenant]
        return level

    def _leave(self, level: Level, ticket: Ticket, now: float) -> None:
        if not level.queue and not level.inflight:  # the priority empties: its counters go with it
            del self._levels[level.priority]
            self._left_at[level.priority] = now
            return
        if not self._fair:
            return
        tenant = ticket.tenant
        backlog = level.backlog
        backlog[tenant] -= 1
        if backlog[tenant]:
            return
        del backlog[tenant]  # idle now; its counter is kept only while it is above every backlogged one's
        if level.counters[tenant] <= min(level.counters[t] for t in backlog):
            del level.counters[tenant]  # it would be lifted at least this far anyway

    # -- Choosing ------------------------------------------------------------------------------------

    def candidates(self, clock: Callable[[], float], above: int | None = None) -> OrderedDict[Ticket, None] | None:
        """The queued tickets the next admission is chosen from, oldest first: those of the priority whose
        oldest record has the best effective priority at ``clock()`` and, with fair share, of its tenant
        with the lowest counter; with ``above``, only among priorities higher than it (smaller numbers).
        None when there are none."""
        levels = self._levels
        if above is None and len(levels) == 1:  # one priority (the common case): no aging to weigh
            best = next(iter(levels.values()))
        else:
            best = self._best_level(clock(), above)
            if best is None:
                return None
        if not self._fair:
            return best.queue
        counters, tenants = best.counters, best.tenants
        tenant = min(tenants, key=lambda t: (counters[t], next(iter(tenants[t])).seq))
        return tenants[tenant]

    def _best_level(self, now: float, above: int | None) -> Level | None:
        """The priority with records queued (higher than ``above``, if given) whose oldest has the best effective
        priority (ties: the lower base priority)."""
        best: Level | None = None
        best_key = (0, 0)
        aging = self._aging
        for level in self._levels.values():
            if not level.queue or (above is not None and level.priority >= above):
                continue
            effective = level.priority
            if aging is not None:
                effective -= int((now - next(iter(level.queue)).enqueued_at) // aging)
            key = (effective, level.priority)
            if best is None or key < best_key:
                best, best_key = level, key
        return best

    def share_held_until(self, priority: int, now: float, hold: float) -> float:
        """Until when records of ``priority`` are held to their share: ``inf`` while a record of a higher
        priority (a smaller number) is queued or in flight, else ``hold`` seconds after the last such left;
        ``-inf`` when none has been there within ``hold``."""
        if any(p < priority for p in self._levels):
            return math.inf
        until = -math.inf
        for p, left in list(self._left_at.items()):
            if left + hold <= now:
                del self._left_at[p]  # forgotten: nothing of that priority is held back by it any more
            elif p < priority:
                until = max(until, left + hold)
        return until

    def inflight_from(self, priority: int) -> tuple[int, int, int]:
        """(cost, count, step load) in flight of the records of ``priority`` and every lower priority (larger
        numbers)."""
        cost = count = step = 0
        for level in self._levels.values():
            if level.priority >= priority:
                cost += level.inflight_cost
                count += level.inflight
                step += level.inflight_step
        return cost, count, step

    def queued_by_tenant(self) -> dict[Hashable, int]:
        """Records queued per tenant, only tenants with any."""
        return dict(self._queued_by_tenant)

    def held_by_priority(self) -> tuple[dict[int, int], dict[int, int]]:
        """Per priority, ascending: (queued + in-flight cost, only priorities with anything queued or in
        flight; in-flight cost, only priorities with a record in flight)."""
        levels = [self._levels[p] for p in sorted(self._levels)]
        held = {level.priority: level.queued_cost + level.inflight_cost for level in levels}
        return held, {level.priority: level.inflight_cost for level in levels if level.inflight}

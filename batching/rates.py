"""``DrainRate``: how fast records and their cost have been leaving lately, and the wait that makes.

Both batcher modes note the work that leaves (a record leaving the engine, a batch finishing) and turn it
into an estimate of how long new work would wait: the ``expected_wait`` behind ``max_queue_wait_s`` and
behind every :class:`~batching.QueueFullError`'s ``retry_after_s``.
"""

from __future__ import annotations

from collections import deque

__all__ = ["DrainRate"]


class DrainRate:
    """Records and cost leaving per second over the last ``window_s`` seconds (a sliding window).

    Running sums over a deque of ``(when, records, cost)`` events, pruned as time passes: noting and
    estimating are O(1) amortized, whatever the load. The rate runs from the oldest event still in the
    window to now, so it decays while nothing leaves.
    """

    __slots__ = ("_cost", "_count", "_events", "window_s")

    def __init__(self, window_s: float = 10.0) -> None:
        self.window_s = window_s
        self._events: deque[tuple[float, int, int]] = deque()
        self._count = 0
        self._cost = 0

    def note(self, now: float, count: int, cost: int) -> None:
        """``count`` records of total ``cost`` left at ``now`` (a monotonic clock)."""
        self._events.append((now, count, cost))
        self._count += count
        self._cost += cost
        self._prune(now)

    def _prune(self, now: float) -> None:
        events = self._events
        horizon = now - self.window_s
        while events and events[0][0] < horizon:
            _, count, cost = events.popleft()
            self._count -= count
            self._cost -= cost

    def wait(self, now: float, cost_over: int, count_over: int) -> float | None:
        """Seconds until ``cost_over`` more cost and ``count_over`` more records have left, at the recent
        rate (the slower of the two decides). 0.0 when neither is positive (nothing needs to leave); None
        when something must leave but nothing has within the window: no basis for an estimate."""
        if cost_over <= 0 and count_over <= 0:
            return 0.0
        self._prune(now)
        if not self._events:
            return None
        span = max(now - self._events[0][0], 1e-3)
        by_cost = cost_over * span / self._cost if cost_over > 0 and self._cost > 0 else 0.0
        by_count = count_over * span / self._count if count_over > 0 and self._count > 0 else 0.0
        return max(by_cost, by_count)

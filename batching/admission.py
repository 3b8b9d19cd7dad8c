"""First-come-first-served admission to a bounded queue: the batcher's backpressure."""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable


class Admission:
    """Hands out queue slots; when the queue is full, producers wait in arrival order.

    A slot freed by the consumer is *reserved* for the longest-waiting producer, so a newcomer can never
    take it first and the queue never holds more than ``capacity`` records. ``debt`` (reserved slots plus
    waiting producers) lets the hot path decide with one comparison: room iff
    ``queued + debt + count <= capacity``.
    """

    def __init__(self, capacity: int, queued: Callable[[], int]) -> None:
        self.capacity = capacity
        self.debt = 0
        self._queued = queued
        self._waiters: deque[asyncio.Future] = deque()
        self._reserved = 0

    def has_room(self, count: int = 1) -> bool:
        """Whether ``count`` more records may enter the queue now, without waiting."""
        return self._queued() + self.debt + count <= self.capacity

    async def wait(self, loop: asyncio.AbstractEventLoop) -> None:
        """Wait until a slot is reserved for us; the caller then enqueues at once (no await between)."""
        waiter = loop.create_future()
        self._waiters.append(waiter)
        self.debt += 1
        try:
            await waiter
        except asyncio.CancelledError:
            self.debt -= 1
            if waiter.done() and not waiter.cancelled():  # granted a slot we will not use: pass it on
                self._reserved -= 1
                self.grant()
            raise
        # Granted: the reserved slot becomes the caller's queued record. (A close() raised above instead.)
        self._reserved -= 1
        self.debt -= 1

    def grant(self) -> None:
        """Reserve freed slots for waiting producers, oldest first, after records left the queue."""
        free = self.capacity - self._queued() - self._reserved
        waiters = self._waiters
        while free > 0 and waiters:
            waiter = waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)
                self._reserved += 1
                free -= 1

    def close(self, error: BaseException) -> None:
        """Fail every waiting producer with ``error`` (the batcher is stopping)."""
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_exception(error)
                self.debt -= 1

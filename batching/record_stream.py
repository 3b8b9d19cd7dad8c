"""``RecordStream``: one continuous-batcher record's outputs, in order, as the engine produces them."""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable
from typing import Any, Generic

from .errors import BatcherStoppedError
from .protocols import ResultT

__all__ = ["RecordStream"]

_END = object()


class _Failure:
    __slots__ = ("error",)

    def __init__(self, error: BaseException) -> None:
        self.error = error


def _wake(waiter: asyncio.Future) -> None:
    if not waiter.done():
        waiter.set_result(None)


class RecordStream(Generic[ResultT]):
    """One record's outputs, in order, as the engine produces them; ends exactly once.

    Iterate it (``async for``); it raises the processing error if the record failed, or
    :class:`~batching.BatcherStoppedError` if the batcher stopped before it ran. ``aclose()`` (also on leaving
    ``async with``) withdraws the record: from the queue if it has not started, else by cancelling its run,
    which frees its cost at once. With ``coalesce`` (``(earlier, later)`` -> one output, or None where they
    must stay apart), a consumer that fell behind takes the outputs waiting for it as one: each costs its
    consumer (a chunk on a socket) what one costs, however few tokens it carries. Nothing waits to be joined
    unless ``interval_s`` paces the consumer: an output that comes within it of the last one taken waits for it
    to pass (or for the stream's end), joined with what comes meanwhile. :meth:`admitted` waits for the record's
    admission, for a consumer that runs the work itself while the record holds its place in the budget.
    """

    __slots__ = (
        "_admitted",
        "_buffer",
        "_cancel",
        "_coalesce",
        "_ended",
        "_interval",
        "_next_at",
        "_pacing",
        "_waiter",
    )

    def __init__(
        self,
        cancel: Callable[[], None],
        coalesce: Callable[[ResultT, ResultT], ResultT | None] | None = None,
        interval_s: float = 0.0,
    ) -> None:
        self._buffer: deque[Any] = deque()
        self._waiter: asyncio.Future | None = None
        self._ended = False
        self._cancel = cancel
        self._coalesce = coalesce
        self._interval = interval_s if coalesce is not None else 0.0
        self._next_at = 0.0
        self._pacing = False
        self._admitted = False

    # -- producer side (the batcher) ----------------------------------------------------------------

    def _push(self, item: Any) -> None:
        if self._ended:
            return
        self._buffer.append(item)
        if self._pacing and item is not _END and not isinstance(item, _Failure):
            return
        if self._waiter is not None:
            _wake(self._waiter)

    def _end(self, error: BaseException | None = None) -> None:
        if not self._ended:
            self._push(_END if error is None else _Failure(error))
            self._ended = True

    def _admit(self) -> None:
        self._admitted = True
        if self._waiter is not None:
            _wake(self._waiter)

    # -- consumer side ------------------------------------------------------------------------------

    @property
    def done(self) -> bool:
        """Whether the stream has ended (finished, failed or withdrawn)."""
        return self._ended

    def failure(self) -> BaseException | None:
        """The error the stream ended with (the record failed or was withdrawn, the batcher stopped), else None."""
        last = self._buffer[-1] if self._ended and self._buffer else None
        return last.error if isinstance(last, _Failure) else None

    async def admitted(self) -> None:
        """Wait until the record is admitted (it runs from then on), or raise what ended it before that
        (:class:`~batching.BatcherStoppedError` if the batcher stopped or the record was withdrawn)."""
        while not self._admitted:
            if self._ended:
                raise self.failure() or BatcherStoppedError("the record ended before it was admitted")
            self._waiter = asyncio.get_running_loop().create_future()
            try:
                await self._waiter
            finally:
                self._waiter = None

    def __aiter__(self) -> RecordStream[ResultT]:
        return self

    async def __anext__(self) -> ResultT:
        while not self._buffer:
            self._waiter = asyncio.get_running_loop().create_future()
            try:
                await self._waiter
            finally:
                self._waiter = None
        if self._interval:
            await self._pace()
        item = self._buffer[0]
        if item is _END:
            raise StopAsyncIteration
        if isinstance(item, _Failure):
            raise item.error
        buffer = self._buffer
        buffer.popleft()
        coalesce = self._coalesce
        while coalesce is not None and buffer and buffer[0] is not _END and not isinstance(buffer[0], _Failure):
            joined = coalesce(item, buffer[0])
            if joined is None:
                break
            item = joined
            buffer.popleft()
        if self._interval:
            self._next_at = asyncio.get_running_loop().time() + self._interval
        return item

    async def _pace(self) -> None:
        """Hold an output that came within ``interval_s`` of the last one taken until then, so that what comes
        meanwhile goes with it; the stream's end wakes it at once."""
        loop = asyncio.get_running_loop()
        if self._next_at <= loop.time() or self._ended:
            return
        waiter = self._waiter = loop.create_future()
        timer = loop.call_at(self._next_at, _wake, waiter)
        self._pacing = True
        try:
            await waiter
        finally:
            timer.cancel()
            self._waiter = None
            self._pacing = False

    async def aclose(self) -> None:
        """Withdraw the record if it has not finished (idempotent)."""
        if not self._ended:
            self._cancel()

    async def __aenter__(self) -> RecordStream[ResultT]:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

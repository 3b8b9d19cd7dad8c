"""Request output streams: merging several into one (a request with many prompts or ``n`` choices), a batch-mode
future seen as a one-output stream, so both batcher modes share one request path, and a request's place in the
continuous batcher while its own task reads the engine."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import Any

_END = object()
_background: set[asyncio.Task] = set()

CHECK_S = 1.0
"""How often a place whose reader has not finished asks the engine whether it still runs the request."""


def in_background(awaitable: Awaitable[Any]) -> None:
    """Run ``awaitable`` as a task of its own, kept until it ends."""
    task = asyncio.ensure_future(awaitable)
    _background.add(task)
    task.add_done_callback(_background.discard)


class Place:
    """A request's place in the continuous batcher while the request's own task reads the engine's stream: the
    batcher admits it and frees the place when it ends, and its outputs skip the batcher's task (a task switch and
    a queue per output). The reader says when the first output came (:meth:`started`) and when it is done
    (:meth:`end`); if it stalls (a slow client), the place is freed once the engine no longer runs the request, since
    the engine keeps what its reader has not taken, and if no reader ever came (a caller that dropped its outputs
    unread), soon after its admission."""

    __slots__ = ("_done", "_first", "reading")

    FIRST = "first output"
    ENDED = "ended"

    def __init__(self) -> None:
        loop = asyncio.get_running_loop()
        self._first: asyncio.Future = loop.create_future()
        self._done: asyncio.Future = loop.create_future()
        self.reading = False  # set by the reader as it starts

    @property
    def done(self) -> bool:
        return self._done.done()

    def started(self) -> None:
        if not self._first.done():
            self._first.set_result(None)

    def end(self, error: BaseException | None = None) -> None:
        """The reader is done (``error``: it failed); the place is freed."""
        self.started()
        if not self._done.done():
            self._done.set_result(error)

    async def hold(self, running: Callable[[], bool]) -> AsyncIterator[str]:
        """The batcher's record for the request: :attr:`FIRST` with its first output, :attr:`ENDED` once its reader
        is done or ``running()`` says the engine no longer runs it; raises what the reader failed with, or if no
        reader started within :data:`CHECK_S`."""
        while not self._first.done():
            await asyncio.wait((self._first,), timeout=CHECK_S)
            if not (self._first.done() or self.reading):
                raise RuntimeError("no one read it: its caller never took its outputs")
        yield self.FIRST
        while not self._done.done():
            await asyncio.wait((self._done,), timeout=CHECK_S)
            if not self._done.done() and not running():
                break
        error = self._done.result() if self._done.done() else None
        if error is not None:
            raise RuntimeError(f"its reader failed: {error!r}") from error
        yield self.ENDED


class FutureStream:
    """A batch-mode record's future as a stream of one output. Closing it before its result withdraws the
    record from the batcher and aborts it in the engine (where its batch may already be running)."""

    def __init__(self, future: asyncio.Future, request_id: str, abort: Callable[[str], Awaitable[None]]) -> None:
        self._future = future
        self._request_id = request_id
        self._abort = abort
        self._taken = self._closed = False

    def __aiter__(self) -> FutureStream:
        return self

    async def __anext__(self) -> Any:
        if self._taken:
            raise StopAsyncIteration
        result = await self._future  # cancelling this await cancels the future: the record is withdrawn
        self._taken = True
        return result

    async def aclose(self) -> None:
        if self._closed:
            return
        self._closed = True
        if not self._future.done() or self._future.cancelled():
            self._future.cancel()
            in_background(self._abort(self._request_id))


class Deadline:
    """One timer for a whole request, however many outputs it passes on: a timer per await (``asyncio.timeout``)
    is scheduled and cancelled on the loop for every output, which a stream at thousands of tokens a second pays for
    on each. The timer cancels the waiting task only while it waits in :meth:`wait`; one that expires while the
    task is elsewhere (writing the last output) is raised at its next :meth:`wait`."""

    def __init__(self, timeout_s: float) -> None:
        self._timeout_s = timeout_s
        self._expired = False
        self._waiting: asyncio.Task | None = None
        self._timer = asyncio.get_running_loop().call_later(timeout_s, self._expire)

    def _expire(self) -> None:
        self._expired = True
        if self._waiting is not None:
            self._waiting.cancel()

    def _timeout(self) -> TimeoutError:
        return TimeoutError(f"not finished within request_timeout_s={self._timeout_s:g}")

    async def wait(self, awaitable: Awaitable[Any]) -> Any:
        """``await awaitable``, or :class:`TimeoutError` once the deadline has passed."""
        if self._expired:
            close = getattr(awaitable, "close", None)
            if close is not None:
                close()  # a coroutine never awaited
            raise self._timeout()
        task = asyncio.current_task()
        self._waiting = task
        cancelling = getattr(task, "cancelling", None)  # Python 3.11: cancel requests pending
        before = cancelling() if cancelling is not None else 0
        try:
            return await awaitable
        except asyncio.CancelledError:
            uncancel = getattr(task, "uncancel", None)
            left = uncancel() if uncancel is not None else 0
            if self._expired and left <= before:  # our own cancel, no one else's
                raise self._timeout() from None
            raise
        finally:
            self._waiting = None

    def cancel(self) -> None:
        self._timer.cancel()


async def merge(streams: Sequence[Any], timeout_s: float) -> AsyncIterator[tuple[int, Any]]:
    """``(index, output)`` from every stream as each comes; a stream that raises yields ``(index, error)``
    and ends. Raises :class:`TimeoutError` when everything has not ended within ``timeout_s``."""
    deadline = Deadline(timeout_s)
    within = deadline.wait
    if len(streams) == 1:  # the common case: no tasks, no queue
        stream = streams[0]
        try:
            while True:
                try:
                    output = await within(stream.__anext__())
                except StopAsyncIteration:
                    return
                except (TimeoutError, asyncio.CancelledError):
                    raise
                except Exception as exc:
                    yield 0, exc
                    return
                yield 0, output
        finally:
            deadline.cancel()

    queue: asyncio.Queue[tuple[int, Any]] = asyncio.Queue()

    async def pump(index: int, stream: Any) -> None:
        try:
            async for output in stream:
                queue.put_nowait((index, output))
        except Exception as exc:
            queue.put_nowait((index, exc))
        finally:
            queue.put_nowait((index, _END))

    loop = asyncio.get_running_loop()
    tasks = [loop.create_task(pump(i, s)) for i, s in enumerate(streams)]
    try:
        remaining = len(streams)
        while remaining:
            index, output = await within(queue.get())
            if output is _END:
                remaining -= 1
            else:
                yield index, output
    finally:
        deadline.cancel()
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)  # their streams closed, not running, once it ends

"""Request output streams: merging several into one (a request with many prompts or ``n`` choices), and a
batch-mode future seen as a one-output stream, so both batcher modes share one request path."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import Any

_END = object()
_background: set[asyncio.Task] = set()
TIMEOUT_AT = getattr(asyncio, "timeout_at", None)
"""Python 3.11's deadline for an await: a timer on the loop. ``asyncio.wait_for`` (3.10) wraps every await in a
task of its own, which a stream pays for every output it passes on."""


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
            task = asyncio.get_running_loop().create_task(self._abort(self._request_id))
            _background.add(task)
            task.add_done_callback(_background.discard)


async def merge(streams: Sequence[Any], timeout_s: float) -> AsyncIterator[tuple[int, Any]]:
    """``(index, output)`` from every stream as each comes; a stream that raises yields ``(index, error)``
    and ends. Raises :class:`TimeoutError` when everything has not ended within ``timeout_s``."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s

    async def within(awaitable: Awaitable[Any]) -> Any:
        try:
            if TIMEOUT_AT is None:  # Python 3.10
                return await asyncio.wait_for(awaitable, max(0.0, deadline - loop.time()))
            async with TIMEOUT_AT(deadline):
                return await awaitable
        except asyncio.TimeoutError:
            raise TimeoutError(f"not finished within request_timeout_s={timeout_s:g}") from None

    if len(streams) == 1:  # the common case: no tasks, no queue
        stream = streams[0]
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

    queue: asyncio.Queue[tuple[int, Any]] = asyncio.Queue()

    async def pump(index: int, stream: Any) -> None:
        try:
            async for output in stream:
                queue.put_nowait((index, output))
        except Exception as exc:
            queue.put_nowait((index, exc))
        finally:
            queue.put_nowait((index, _END))

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
        for task in tasks:
            task.cancel()

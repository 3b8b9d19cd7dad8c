"""Exceptions raised by the batcher, so callers can tell overload, shutdown and engine aborts apart."""

from __future__ import annotations

from typing import Any


class BatcherError(RuntimeError):
    """Base class for errors the batcher itself raises (as opposed to errors raised by ``process_fn``)."""


class QueueFullError(BatcherError):
    """The queue has no room, or the wait would be too long, and the caller asked not to wait
    (``submit_nowait``): retry later.

    ``retry_after_s`` is the batcher's estimate, when it refused, of the seconds until the refused records
    would have been admitted behind what was queued (from the recent rate at which work left the engine),
    for a ``Retry-After`` header; ``None`` when it had no basis (nothing had finished lately). It survives
    pickling (Ray ships exceptions between processes).
    """

    def __init__(self, *args: Any, retry_after_s: float | None = None) -> None:
        super().__init__(*args)
        self.retry_after_s = retry_after_s


class BatcherStoppedError(BatcherError):
    """The batcher is stopping or stopped, so the record was not (or will not be) processed."""


class BatchCancelledError(BatcherError):
    """``process_fn`` raised ``asyncio.CancelledError`` (for example an aborted engine request).

    The batch's futures get this error instead of being cancelled, so a caller can tell an engine abort
    from the cancellation of its own task.
    """

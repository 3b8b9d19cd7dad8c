"""Exceptions raised by the batcher, so callers can tell overload, shutdown and engine aborts apart."""

from __future__ import annotations


class BatcherError(RuntimeError):
    """Base class for errors the batcher itself raises (as opposed to errors raised by ``process_fn``)."""


class QueueFullError(BatcherError):
    """The queue has no room and the caller asked not to wait (``submit_nowait``): retry later."""


class BatcherStoppedError(BatcherError):
    """The batcher is stopping or stopped, so the record was not (or will not be) processed."""


class BatchCancelledError(BatcherError):
    """``process_fn`` raised ``asyncio.CancelledError`` (for example an aborted engine request).

    The batch's futures get this error instead of being cancelled, so a caller can tell an engine abort
    from the cancellation of its own task.
    """

"""What both cores share (generation and embeddings): an engine behind a batcher, their lifecycle (start, drain
and stop, live reconfiguration, health), the count of requests they hold, and what they report. A core works
without Ray Serve: a Serve replica, a Ray Data actor or a plain asyncio program holds one."""

from __future__ import annotations

import gc
import logging
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, Generic, Protocol, TypeVar

from batching import QueueFullError

from ..errors import RequestError

logger = logging.getLogger("serve_app")

ConfigT = TypeVar("ConfigT")
SettingsT = TypeVar("SettingsT")


def freeze_startup_heap() -> float:
    """Put every object alive now out of the garbage collector's reach (``gc.freeze``), as vLLM's server and
    engine, and Ray Serve for its replicas (``RAY_SERVE_FREEZE_GC_ON_STARTUP``), do once they are up; the seconds
    the last full collection took. A process holding a core carries Ray's and the engine client's objects, about
    750,000 with the bundled model, and each full collection walked them all: about 0.4 s on a 2-core CPU, its
    event loop stalled that long. For a process that is not a Serve replica (a Ray Data actor), once its core
    has started."""
    started = time.perf_counter()
    gc.collect()
    gc.freeze()
    took = time.perf_counter() - started
    logger.info("startup heap frozen: %d objects out of the collector's reach (%.2f s)", gc.get_freeze_count(), took)
    return took


def check_batch(values: Any, field: str, noun: str, limit: int, of: str = "strings") -> None:
    """A request's batch of inputs (``field``: its name, ``noun``: what it holds, ``of``: what each is) is a list,
    not empty, and at most ``limit`` long."""
    if isinstance(values, str) or not isinstance(values, (list, tuple)):
        got = "a single string" if isinstance(values, str) else type(values).__name__
        raise RequestError(f"{field} must be a list of {of}, got {got}", param=field)
    if not values:
        raise RequestError(f"no {noun} provided", param=field)
    if len(values) > limit:
        raise RequestError(f"{len(values)} {noun} in one request; at most {limit} are allowed", param=field)


class Observer(Protocol):
    """Who hears what the batcher does (a replica's metrics): requests entering the engine, and refusals."""

    def started(self, costs: list[int], waits: list[float], batch: bool) -> None:
        """Requests of ``costs`` entered the engine after waiting ``waits`` seconds; ``batch``: as one batch."""

    def rejected(self, count: int) -> None:
        """``count`` requests were refused: the queue was full."""


class Core(Generic[ConfigT, SettingsT]):
    """An engine and the batcher in front of it. Subclasses build both (:meth:`_new_batcher`)."""

    def __init__(self, config: ConfigT, engine: Any, observer: Observer | None = None) -> None:
        self.config = config
        self.engine = engine
        self.observer = observer
        self.settings: SettingsT = config.batcher  # type: ignore[attr-defined]
        self.budget = 0  # tokens the engine holds at once (set by _new_batcher)
        self.batcher = self._new_batcher(self.settings)
        self.ongoing = self.peak_ongoing = 0  # requests inside the core now, and at most so far
        self.abandoned = 0  # inputs whose callers went away (disconnected, cancelled, timed out)

    def _new_batcher(self, settings: SettingsT) -> Any:
        """The batcher ``settings`` describe, in front of the engine; sets :attr:`budget`."""
        raise NotImplementedError

    async def start(self) -> None:
        """Start the batcher on the running event loop."""
        await self.batcher.start()

    async def stop(self, timeout: float | None = None) -> None:
        """Finish what the batcher holds (at most ``timeout`` seconds), then release the engine."""
        await self.batcher.stop(timeout=timeout)
        logger.info("%s drained: %s", type(self).__name__, self.batcher.stats.to_dict())
        await self.engine.shutdown()

    async def reconfigure(self, settings: SettingsT) -> None:
        """Swap in a batcher with new settings: it takes new requests at once while the old one drains."""
        if settings == self.settings and self.batcher.is_running:
            return
        old, self.batcher = self.batcher, self._new_batcher(settings)
        await self.batcher.start()
        self.settings = settings
        logger.info("batcher reconfigured: %s", settings.model_dump())  # type: ignore[attr-defined]
        await old.stop()

    async def check_health(self) -> None:
        """Raise when the engine is dead or the batcher stopped."""
        await self.engine.check_health()
        if not self.batcher.is_running:
            raise RuntimeError("the batcher is not running")

    def _queue(self, submit: Any, requests: list[Any]) -> Any:
        """``submit(requests)``, counting a refusal (a full queue refuses all or none, at once)."""
        try:
            return submit(requests)
        except QueueFullError:
            if self.observer is not None:
                self.observer.rejected(len(requests))
            raise

    def _started(self, requests: list[Any], batch: bool) -> None:
        if self.observer is not None:
            now = time.monotonic()
            costs = [r.estimate_tokens() for r in requests]
            self.observer.started(costs, [now - r.submitted_at for r in requests], batch)

    @contextmanager
    def _holding(self, count: int) -> Iterator[list[int]]:
        """Count a request of ``count`` inputs while it is inside; yields a one-item list the caller sets to how
        many of them finished (the rest were abandoned)."""
        self.ongoing += 1
        self.peak_ongoing = max(self.peak_ongoing, self.ongoing)
        finished = [0]
        try:
            yield finished
        finally:
            self.ongoing -= 1
            self.abandoned += count - finished[0]

    def stats(self) -> dict[str, Any]:
        """The engine's and the batcher's statistics, and the requests held."""
        return {
            "engine": self.engine.name,
            "model": self.config.model_name,  # type: ignore[attr-defined]
            "requests": {"ongoing": self.ongoing, "peak": self.peak_ongoing, "abandoned": self.abandoned},
            "engine_stats": self.engine.stats(),
            "batcher_settings": self.settings.model_dump(),  # type: ignore[attr-defined]
            "batcher": self.batcher.stats.to_dict(),
        }

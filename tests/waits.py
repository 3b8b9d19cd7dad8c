"""Waiting on state, not on the clock: polls that fail naming what they waited for, and a Ray Data job run in a
thread while an async test watches the app."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable, Iterable
from typing import Any


class RowsInThread(threading.Thread):
    """Runs a Ray Data job (``job()`` returns its rows) in a thread, so that an async test can watch and disturb
    the app meanwhile: ``rows`` fills as they arrive, ``failure`` holds what the job raised."""

    def __init__(self, job: Callable[[], Iterable[dict[str, Any]]]) -> None:
        super().__init__(daemon=True)
        self.job = job
        self.rows: list[dict[str, Any]] = []
        self.failure: list[BaseException] = []

    def run(self) -> None:
        try:
            self.rows.extend(self.job())
        except BaseException as exc:  # the test asserts there is none
            self.failure.append(exc)


def wait_until(
    condition: Callable[[], Any],
    timeout: float,
    what: str,
    interval: float = 0.1,
    detail: Callable[[], str] = lambda: "",
) -> Any:
    """:func:`wait_for` for code outside asyncio: poll ``condition()`` until it returns something truthy; fail
    naming ``what`` (and ``detail()``, the state that explains it) after ``timeout`` s."""
    deadline = time.monotonic() + timeout
    while not (value := condition()):
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}{detail()}")
        time.sleep(interval)
    return value


async def wait_for(condition, timeout: float, what: str, interval: float = 0.25) -> Any:
    """Poll ``condition()`` (sync or async) until it returns something truthy; fail naming ``what``."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if asyncio.iscoroutine(value):
            value = await value
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        await asyncio.sleep(interval)


def batcher_is(handle: Any, key: str, test) -> Any:
    """An async condition for :func:`wait_for`: ``test(stats["batcher"][key])`` on the replica's stats."""

    async def check() -> bool:
        return bool(test((await handle.stats.remote())["batcher"][key]))

    return check


async def per_replica_stats(handle: Any, replicas: int, timeout: float = 30) -> dict[str, dict[str, Any]]:
    """Each live replica's ``stats()``, by replica id (calls land on random replicas until all have answered)."""
    seen: dict[str, dict[str, Any]] = {}
    deadline = time.monotonic() + timeout
    while len(seen) < replicas:
        assert time.monotonic() < deadline, f"only {len(seen)} of {replicas} replicas answered stats()"
        stats = await handle.stats.remote()
        seen[stats["replica"]["replica_id"]] = stats
    return seen


def completed(handle: Any) -> int:
    """Prompts the (one) replica has answered so far."""
    return handle.stats.remote().result()["batcher"]["total_completed"]


def idle(handle: Any) -> None:
    """Wait until the replica holds no request (a killed job's last requests still finish there)."""

    async def check() -> bool:
        return (await handle.stats.remote())["requests"]["ongoing"] == 0

    asyncio.run(wait_for(check, 60, "the replica to finish the killed job's requests"))

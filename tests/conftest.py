"""Shared fixtures: one local Ray + Serve instance per test session (loopback only) and an app factory.

One Ray cluster per pytest process: connecting one process to several clusters in turn trips Ray's
reference counting (repeated job and object ids). The end-to-end test of `serve run` therefore runs its
own cluster in subprocesses (test_real_app.py) and never connects this process to it.
"""

from __future__ import annotations

import asyncio
import os
import threading
import time
from collections.abc import Callable, Iterable
from typing import Any

import pytest

from benchmarks.environment import free_port

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
os.environ.setdefault("RAY_DEDUP_LOGS", "0")
os.environ.pop("SERVE_APP_API_KEY", None)  # a developer's key must not lock the keyless tests' replicas out


FIGURES: dict[str, dict[str, Any]] = {}  # what the reliability tests measured, printed at the end of the run


def pytest_terminal_summary(terminalreporter: Any) -> None:
    """Print the figures the reliability tests recorded (load held, faults survived, inputs tried)."""
    if not FIGURES:
        return
    terminalreporter.section("reliability figures")
    for name, figures in FIGURES.items():
        terminalreporter.write_line(f"{name}: " + ", ".join(f"{key}={value}" for key, value in figures.items()))


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


def result_of_private_cluster(args: list[str], timeout: float) -> dict[str, Any]:
    """Run ``python *args`` (a script that starts its own local Ray cluster, as this process belongs to the
    session's) with a private Ray temp dir, stop it and its cluster, and return the JSON of its last
    ``RESULT {...}`` line (failing with the end of its output when there is none)."""
    import json
    import subprocess
    import sys
    import tempfile

    from benchmarks.procs import spawn, stop

    ray_tmp = tempfile.mkdtemp(prefix="rt", dir="/tmp")  # a private cluster: its own temp dir, found and cleaned
    env = {**os.environ, "RAY_TMPDIR": ray_tmp, "RAY_ADDRESS": "", "RAY_USAGE_STATS_ENABLED": "0"}
    proc = spawn(
        [sys.executable, *args],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        output, _ = proc.communicate(timeout=timeout)
    finally:
        stop(proc, ray_tmp)
    lines = [line for line in output.splitlines() if line.startswith("RESULT ")]
    assert lines, output[-5000:]
    return json.loads(lines[-1].removeprefix("RESULT "))


def completed(handle: Any) -> int:
    """Prompts the (one) replica has answered so far."""
    return handle.stats.remote().result()["batcher"]["total_completed"]


def idle(handle: Any) -> None:
    """Wait until the replica holds no request (a killed job's last requests still finish there)."""

    async def check() -> bool:
        return (await handle.stats.remote())["requests"]["ongoing"] == 0

    asyncio.run(wait_for(check, 60, "the replica to finish the killed job's requests"))


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Run the `serve run` end-to-end module first: its cluster is then the only one on the machine, as on
    a user's, so the README's ``ray.init(address="auto")`` finds it; the session's cluster starts later."""
    items.sort(key=lambda item: item.module.__name__.rsplit(".", 1)[-1] != "test_real_app")


@pytest.fixture(scope="session")
def serve_instance():
    """Ray (2 CPUs) and Serve with HTTP on a free loopback port; the base URL."""
    ray = pytest.importorskip("ray")
    from ray import serve

    port = free_port()
    ray.init(num_cpus=2, include_dashboard=False, configure_logging=False, log_to_driver=False)
    serve.start(http_options={"host": "127.0.0.1", "port": port})
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        serve.shutdown()
        ray.shutdown()


SIMULATED_DEFAULTS: dict[str, Any] = {
    "engine": "simulated",
    "autoscaling": {"min_replicas": 1, "max_replicas": 1, "target_ongoing_requests": 64},
    "cpus_per_replica": 0.25,
}


def merge(base: dict[str, Any], extra: dict[str, Any]) -> dict[str, Any]:
    """``base`` updated by ``extra``, one level of nested dicts merged."""
    out = dict(base)
    for key, value in extra.items():
        out[key] = {**out.get(key, {}), **value} if isinstance(value, dict) else value
    return out


@pytest.fixture(scope="module")
def deploy_app(serve_instance):
    """``deploy_app(name, **args)``: run a SIMULATED-engine app at ``/name``; deleted after the module."""
    from ray import serve

    from serve_app.app import build_app

    names: list[str] = []

    def deploy(name: str, **args: Any):
        handle = serve.run(build_app(merge(SIMULATED_DEFAULTS, args)), name=name, route_prefix=f"/{name}")
        names.append(name)
        return handle

    yield deploy
    live = serve.status().applications
    for name in names:
        if name in live:  # a test may have deleted its own
            serve.delete(name)


@pytest.fixture
def apps(serve_instance):
    """Names of apps to delete after the test, pass or fail: a 2-CPU cluster holds only a few replicas."""
    from ray import serve

    names: list[str] = []
    yield names
    live = serve.status().applications
    for name in names:
        if name in live:
            serve.delete(name)


@pytest.fixture
def deploy(deploy_app, apps):
    """``deploy_app`` whose apps are deleted after each test."""

    def run(name: str, **args: Any) -> Any:
        apps.append(name)
        return deploy_app(name, **args)

    return run

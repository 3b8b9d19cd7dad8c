"""Shared fixtures, by tier (tests/README.md): the session's Ray + Serve instance (loopback only) and an app
factory for the simulated engine (``serve``); the session's real app, ``serve run serve_config.yaml`` on vLLM, and a
vLLM engine in this process (``system``; the app itself in ``real_apps.py``); sizes per tier for the load tests.
Helpers that wait on state are in ``waits.py``.

One Ray cluster per pytest process: connecting one process to several clusters in turn trips Ray's reference
counting (repeated job and object ids). The real app therefore runs its own cluster, in subprocesses, and a test
reaches it over HTTP or through :meth:`RealApp.call`, a driver of that cluster in a subprocess.
"""

from __future__ import annotations

import asyncio
import os
import sys
import threading
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from harness import pytest_tiers, tiers
from harness.launcher import merged
from harness.ports import free_port
from harness.pytest_tiers import close_after_last_use

from .real_apps import RealApp, RealApps
from .waits import wait_until

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
os.environ.setdefault("RAY_DEDUP_LOGS", "0")
os.environ.pop("SERVE_APP_API_KEY", None)  # a developer's key must not lock the keyless tests' replicas out


def sized(ci: Any, soak: Any, tier: str = "serve") -> list[Any]:
    """Parameters for a load or fuzz test's size (a value, or a tuple of values): ``ci`` in its own ``tier`` (what
    ``make test`` runs) and ``soak`` in the soak tier (``make test-soak``), with the same assertions."""

    def param(size: Any, name: str, mark: pytest.MarkDecorator) -> Any:
        values = size if isinstance(size, tuple) else (size,)
        return pytest.param(*values, id=f"{name}-" + "-".join(map(str, values)), marks=mark)

    return [param(ci, "ci", getattr(pytest.mark, tier)), param(soak, "soak", pytest.mark.soak)]


FIGURES: dict[str, dict[str, Any]] = {}  # what the reliability tests measured, printed at the end of the run


def pytest_terminal_summary(terminalreporter: Any) -> None:
    """Print the figures the reliability tests recorded (load held, faults survived, inputs tried)."""
    if not FIGURES:
        return
    terminalreporter.section("reliability figures")
    for name, figures in FIGURES.items():
        terminalreporter.write_line(f"{name}: " + ", ".join(f"{key}={value}" for key, value in figures.items()))


SERVE_CLIENT_POLL_S = 0.05
"""How often this process's Serve client asks the controller whether a deploy is done (Ray's default: 1 s)."""


class SessionCluster:
    """The session's Ray + Serve cluster and the apps whose replicas are slow to start (they import vLLM or torch),
    started in a thread as the session's first test begins: they come up while the unit tier runs on the other
    core. A fixture then takes the cluster (:meth:`url`) or an app (:meth:`app`), waiting for it where it is not up."""

    def __init__(self, apps: list[str]) -> None:
        self._apps = apps
        self._error: BaseException | None = None
        self._url = ""
        self._up, self._closed = threading.Event(), threading.Event()
        self._thread = threading.Thread(target=self._start, name="session-cluster", daemon=True)
        self._thread.start()

    def _start(self) -> None:
        try:
            import ray
            from ray import serve
            from ray.serve._private import client

            # Serve's client checks whether a deploy (or a delete) is done once a second; the tests deploy about a
            # hundred apps, each then waiting half a second on average for nothing.
            client.CLIENT_POLLING_INTERVAL_S = SERVE_CLIENT_POLL_S
            port = free_port()
            ray.init(num_cpus=2, include_dashboard=False, configure_logging=False, log_to_driver=False)
            serve.start(http_options={"host": "127.0.0.1", "port": port})
            self._url = f"http://127.0.0.1:{port}"
            for name in self._apps:
                route, build = SLOW_APPS[name]
                serve._run(build(), _blocking=False, name=name, route_prefix=route)
        except BaseException as exc:  # raised where the cluster is taken
            self._error = exc
        finally:
            self._up.set()
        # Ray's processes die with the thread that started them (Linux's parent-death signal): this one stays.
        self._closed.wait()

    def started(self) -> None:
        """Wait until Ray and Serve are up (or failed to come up): the starting thread's calls into Ray have ended."""
        self._up.wait()

    def url(self) -> str:
        """The Serve HTTP base URL, once Ray and Serve are up."""
        self.started()
        if self._error is not None:
            raise self._error
        return self._url

    def closed(self) -> None:
        """Let the starting thread end, once Ray is shut down."""
        self._closed.set()

    def app(self, name: str) -> Any:
        """The handle of :data:`SLOW_APPS` ``name`` once it runs: the one started with the session the first time,
        else deployed now (a module that took it before may have deleted it)."""
        from ray import serve

        self.url()

        def status() -> str | None:
            app = serve.status().applications.get(name)
            if app is not None and app.status == "DEPLOY_FAILED":
                raise RuntimeError(f"the session's app {name!r} failed to deploy: {app.message}")
            return None if app is None else app.status

        if name in self._apps:
            self._apps.remove(name)
            wait_until(lambda: status() == "RUNNING", 300, f"the session's app {name!r} to run", SERVE_CLIENT_POLL_S)
            return serve.get_app_handle(name)
        wait_until(lambda: status() != "DELETING", 60, f"the app {name!r} to be deleted", SERVE_CLIENT_POLL_S)
        route, build = SLOW_APPS[name]
        return serve.run(build(), name=name, route_prefix=route)


_cluster: SessionCluster | None = None


def session_cluster() -> SessionCluster:
    global _cluster
    if _cluster is None:
        _cluster = SessionCluster([])
    return _cluster


@pytest.fixture(scope="session", autouse=True)
def cluster_started_early(request) -> Iterator[None]:
    """Start the session's cluster and the slow apps its tests use (:class:`SessionCluster`) with the session's
    first test, where a later test of the serve tier or above uses the cluster."""
    global _cluster
    items = request.session.items
    above_unit = [item for item in items if pytest_tiers.tier_of(item) != "unit"]
    if _cluster is None and any(pytest_tiers.uses(item, "serve_instance") for item in above_unit):
        _cluster = SessionCluster([name for name in SLOW_APPS if any(uses_slow_app(item, name) for item in items)])
    yield


@pytest.hookimpl(trylast=True)  # after the fixtures' setup, which starts the cluster with the session's first test
def pytest_runtest_setup(item: pytest.Item) -> None:
    """A test that draws with Hypothesis waits until a starting session cluster is up: Ray draws from the
    ``random`` module as it starts, and Hypothesis takes a change of that state during a draw for the strategy's own
    use of ``random`` (a ``HypothesisDeprecationWarning``, an error in a later Hypothesis)."""
    hypothesis, module = sys.modules.get("hypothesis"), getattr(item, "module", None)
    if _cluster is not None and hypothesis is not None and getattr(module, "given", None) is hypothesis.given:
        _cluster.started()


@pytest.fixture(scope="session")
def serve_instance():
    """Ray (2 CPUs) and Serve with HTTP on a free loopback port; the base URL."""
    ray = pytest.importorskip("ray")
    from ray import serve

    def close() -> None:
        if ray.is_initialized():
            serve.shutdown()
            ray.shutdown()
        session_cluster().closed()

    close_after_last_use("serve_instance", close)
    try:
        yield session_cluster().url()
    finally:
        close()


SIMULATED_DEFAULTS: dict[str, Any] = {
    "engine": "simulated",
    "autoscaling": {"min_replicas": 1, "max_replicas": 1, "target_ongoing_requests": 64},
    "cpus_per_replica": 0.25,
}


REPLY = "__simulated_reply__"
"""What a prompt holds, with a number K, to be answered with ``SCRIPTED["replies"][K]`` (the simulated engine's
``reply_marker``)."""


def weather_call(city: str) -> str:
    """A call as the bundled template asks the model to write it (hermes' format)."""
    return f'<tool_call>\n{{"name": "get_weather", "arguments": {{"city": "{city}"}}}}\n</tool_call>'


REPLIES = [
    "<think>I should greet.</think>Hello there!",
    f"<think>Weather needed.</think>{weather_call('Paris')}",
    f"<think>Two cities.</think>{weather_call('Paris')}\n{weather_call('Lyon')}",
    "Still thinking about it",
]
PARSERS = {"reasoning_parser": "qwen3", "tool_call_parser": "hermes"}
"""Two of vLLM's parsers that read text the bundled tokenizer has no special tokens for (``<think>``,
``<tool_call>``). Qwen3's reads an output as thoughts until ``</think>`` (its template opens them in the prompt)."""
SCRIPTED: dict[str, Any] = {
    "simulated": {"tokenizer": True, "replies": REPLIES, "step_s": 0.002},
    "vllm": PARSERS,
}
"""A SIMULATED app that says scripted replies in the bundled model's tokens, read by vLLM's parsers."""


def scripted() -> Any:
    from serve_app.app import build_app

    return build_app(merged(SIMULATED_DEFAULTS, {**SCRIPTED, "cpus_per_replica": 0}))


def padded_embeddings() -> Any:
    from serve_app.app import build_embeddings_app

    return build_embeddings_app(
        {"engine": "padded", "cpus_per_replica": 0, "autoscaling": {"min_replicas": 1, "max_replicas": 1}}
    )


SLOW_APPS: dict[str, tuple[str, Callable[[], Any]]] = {
    "scripted": ("/scripted", scripted),
    "both-embeddings": ("/both/v1/embeddings", padded_embeddings),
}
"""Apps whose replicas import vLLM (the scripted app's parsers) or torch (the padded encoder), by name: their route
and how they are built. The scripted app serves the whole session; the padded encoder serves test_embeddings' module
beside its simulated generation app ``both``, which deletes it. Started with the session, they take no logical CPU:
the Ray Data jobs of the tests before theirs count the cluster's free CPUs."""


def uses_slow_app(item: pytest.Item, name: str) -> bool:
    if name == "scripted":
        return "scripted_app" in getattr(item, "fixturenames", ())
    return getattr(getattr(item, "callspec", None), "params", {}).get("served") == "padded"


@pytest.fixture(scope="session")
def scripted_app(serve_instance) -> tuple[str, Any]:
    """The :data:`SCRIPTED` app at ``/scripted`` (its base URL and handle), for the tests of what a model writes (tool
    calls, reasoning, the Responses API, agent frameworks): one for the session, as its replica imports vLLM for the
    parsers, taking no logical CPU (which later modules' Ray Data jobs count on)."""
    return serve_instance + "/scripted", session_cluster().app("scripted")


def _delete(names: list[str]) -> None:
    """Delete the apps ``names`` that still run (a test may have deleted its own), without waiting for their replicas
    to stop: the next test goes on meanwhile (its apps have names of their own)."""
    from ray import serve

    live = serve.status().applications
    for name in names:
        if name in live:
            serve.delete(name, _blocking=False)


@pytest.fixture(scope="module")
def deploy_app(serve_instance):
    """``deploy_app(name, **args)``: run a SIMULATED-engine app at ``/name``; deleted after the module."""
    from ray import serve

    from serve_app.app import build_app

    names: list[str] = []

    def deploy(name: str, **args: Any):
        config = merged(SIMULATED_DEFAULTS, args)
        if config["engine"] != "simulated":
            tiers.require("system", f"a real engine in the session's cluster (app {name!r})")
        if max(config["autoscaling"].get(key, 1) for key in ("min_replicas", "max_replicas")) > 1:
            tiers.require("system", f"an app of more than one replica (app {name!r})")
        handle = serve.run(build_app(config), name=name, route_prefix=f"/{name}")
        names.append(name)
        return handle

    yield deploy
    _delete(names)


@pytest.fixture
def apps(serve_instance):
    """Names of apps to delete after the test, pass or fail: a 2-CPU cluster holds only a few replicas."""
    names: list[str] = []
    yield names
    _delete(names)


@pytest.fixture
def deploy(deploy_app, apps):
    """``deploy_app`` whose apps are deleted after each test."""

    def run(name: str, **args: Any) -> Any:
        apps.append(name)
        return deploy_app(name, **args)

    return run


# -- The system tier: the real app and a real engine --------------------------------------------------------------


@pytest.fixture(scope="session")
def real_apps(tmp_path_factory) -> Iterator[RealApps]:
    """The holder of the session's real app, which starts it on a ``system`` test's first :meth:`RealApps.get`."""
    apps = RealApps(tmp_path_factory.mktemp("real-app"))
    close_after_last_use("real_apps", apps.close)
    yield apps
    apps.close()


@pytest.fixture
def real_app(real_apps: RealApps) -> RealApp:
    """The session's real app (generation and embeddings) for a ``system`` test that leaves it as it found it."""
    return real_apps.get()


@pytest.fixture
def real_app_to_end(real_apps: RealApps) -> RealApp:
    """The session's real app for a ``system`` test that may end or disturb it: such tests run after the rest of their
    tier, and the next test that needs the app gets a fresh one if it ended."""
    return real_apps.get()


@pytest.fixture(autouse=True)
def system_tier_gate(monkeypatch) -> None:
    """A test below the ``system`` tier that starts a vLLM engine in this process, a Ray Data job or kills a Ray actor
    (a replica) fails at once, naming the marker it needs."""
    if tiers.current is None or tiers.rank(tiers.current[1]) >= tiers.rank("system"):
        return

    def refusing(what: str) -> Callable[..., Any]:
        def refuse(*args: Any, **kwargs: Any) -> Any:
            tiers.require("system", what)

        return refuse

    for engine in ("serve_app.engines.vllm_engine.VLLMEngine", "serve_app.engines.pooling.PoolingEngine"):
        monkeypatch.setattr(f"{engine}.__init__", refusing("a vLLM engine in the test process"))
    if tiers.current[1] == "serve":  # below it, the session's cluster (which these need) is refused already
        # Every Ray Data job runs through Ray's streaming executor (Ray 2.60's module; a move fails here, loudly).
        monkeypatch.setattr(
            "ray.data._internal.execution.streaming_executor.StreamingExecutor.execute",
            refusing("a Ray Data job (its tasks and actors)"),
        )
        monkeypatch.setattr("ray.kill", refusing("killing a Ray actor (a replica)"))


@pytest.fixture(autouse=True)
def finished_jobs_collected(request) -> Iterator[None]:
    """After a ``system`` test on the session's cluster, collect this process's garbage: a Ray Data job that raised
    (or was left part-read) keeps its executor, and the CPUs of its actors, until its iterator is collected, and a
    later job that waits for free CPUs (a resumed one) would wait on them."""
    yield
    if "serve_instance" in request.fixturenames and tiers.current and tiers.current[1] == "system":
        import gc

        gc.collect()


@pytest.fixture(scope="session")
def engine_loop() -> Iterator[asyncio.AbstractEventLoop]:
    """One event loop for the session's in-process engines: vLLM's AsyncLLM binds its output handler to the loop it
    first runs on."""
    loop = asyncio.new_event_loop()
    yield loop
    loop.close()


@pytest.fixture(scope="session")
def real_core(engine_loop):
    """The generation core on vLLM's engine and the bundled model, in this process, as a replica or a Ray Data actor
    holds it; with the bundled LoRA adapter (``make model`` trains it), so that adapters are tested on the same
    engine."""
    pytest.importorskip("vllm", reason="needs the cpu extra (make setup installs it)")
    from serve_app.adapters import BUNDLED_ADAPTER
    from serve_app.config import AppConfig
    from serve_app.core import Generator

    # Built in the test process itself, which must not lower its own priority as a replica does.
    vllm = {"max_model_len": 1024, "cpu_replica_niceness": 0}
    core = Generator(AppConfig(vllm=vllm, lora={"adapters": {BUNDLED_ADAPTER: "bundled"}, "max_rank": 8}))
    engine_loop.run_until_complete(core.start())
    stopped: list[bool] = []

    def close() -> None:
        if not stopped:
            stopped.append(True)
            engine_loop.run_until_complete(core.stop())

    close_after_last_use("real_core", close)
    yield core
    close()

"""No vLLM engine process outlives its replica (issue item 8), with the real engine and the bundled model.

A replica's engine is its Ray worker's child ``VLLM::EngineCore`` (and that one's ``VLLM::Worker``): it holds the KV
cache's memory, on a GPU the GPU's, so a leaked one keeps a replacement replica from starting. vLLM's EngineCore
does not notice its owner dying; Ray kills it (``serve.env``: per-worker process groups and children killed on
worker exit), or, where the raylet goes first, the replica's engine reaper (serve_app/engines/reaper.py). Each case
kills a replica the way a user or Serve does, against `serve run serve_config.yaml` started as a user does
(``serve.env`` applied, a private ``RAY_TMPDIR``, this process never connecting to that cluster: drivers run as
subprocesses), and waits, with a bound, for every process below that replica to be gone. The cases run after the
tier's other tests, in this order. Two use the session's real app (the second ends it):

- ``serve.delete`` of the embedding app during a burst of requests;
- Ctrl-C twice on ``serve run`` during a burst (the second while it shuts down).

Two use a `serve run` of the generation app alone, the module's, from its start (the first case needs its replicas
starting, the second ends it):

- a generation replica killed (SIGKILL of its worker, then ``ray.kill`` of its actor) while its engine starts;
- `ray stop --force` during a burst (the raylet killed with the replica: the engine reaper's case), after which
  HAProxy must be gone too and the HTTP port free for the next `serve run`.

Processes are told apart by parentage (the replica's descendants, found by the run's ``RAY_TMPDIR`` in their
environment) and named by pid and start time, never by name alone.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest

from harness.environment import ROOT
from harness.launcher import SERVE_RUN_START_S, Server, healthy, serve_run
from harness.ports import port_taken
from harness.procs import alive, descendants, engine_of, processes, replicas
from serve_app.engines.procs import Proc

from .conftest import FIGURES
from .waits import wait_until

ENGINE_GONE_S = 30.0  # the bound: no engine process outlives its replica by more
BURST = """
import asyncio, sys, httpx
async def main(url, n):
    async with httpx.AsyncClient(timeout=600, limits=httpx.Limits(max_connections=n)) as client:
        async def one(i):
            body = {"prompt": f"Story {i}: once upon a time", "max_tokens": 128, "ignore_eos": True}
            try:
                return (await client.post(url + "/v1/completions", json=body)).status_code
            except httpx.HTTPError as exc:
                return type(exc).__name__
        print(sorted(map(str, await asyncio.gather(*(one(i) for i in range(n))))), flush=True)
asyncio.run(main(sys.argv[1], int(sys.argv[2])))
"""
EMBEDDED = "a batcher groups requests of similar length " * 24  # 16 of it a request, some seconds' work

DELETE_WHEN_BUSY = """
import sys, time, ray
from ray import serve
ray.init(log_to_driver=False)
app, text, calls = sys.argv[1], sys.argv[2], int(sys.argv[3])
assert app in serve.status().applications, serve.status().applications
handle = serve.get_app_handle(app)
burst = [handle.embed.remote([text] * 16) for _ in range(calls)]  # sent once connected: no wait for a client
deadline = time.monotonic() + 120
while not (stats := handle.stats.remote().result()["batcher"])["in_flight"]:  # the burst is inside its engine
    assert time.monotonic() < deadline, stats
    time.sleep(0.2)
try:
    serve.delete(app)  # blocks until Serve has stopped the app's replicas (they drain the burst), up to 60 s
except TimeoutError:  # draining past that: Serve force-kills the replica at graceful_shutdown_timeout_s
    deadline = time.monotonic() + 120
    while app in serve.status().applications and time.monotonic() < deadline:
        time.sleep(0.5)
"""


@dataclass
class Run:
    """`serve run serve_config.yaml` in its own Ray cluster, as `make serve` runs it, and what a case started beside
    it (the clients of a burst)."""

    server: Server
    helpers: list[subprocess.Popen] = field(default_factory=list)

    @property
    def url(self) -> str:
        return self.server.url

    def log_text(self) -> str:
        return self.server.log_text()

    def healthy(self) -> bool:
        return healthy(self.server)

    def wait_healthy(self) -> None:
        wait_until(lambda: self.healthy() or self.exited(), SERVE_RUN_START_S, "the llm app to be ready", interval=1)
        assert not self.exited(), f"serve run exited:\n{self.log_text()[-5000:]}"

    def exited(self) -> bool:
        return self.server.exited()

    def replica_with_engine(self, app: str = "llm") -> tuple[Proc, list[Proc]] | None:
        """A replica of ``app`` that has started its engine, and the processes below it (EngineCore, its Worker, and
        multiprocessing's resource tracker and the engine reaper): by parentage, as vLLM's process titles are not
        always set yet."""
        table = processes(self.server.marker)
        for pid in replicas(table, app):
            if engine_of(table, pid):
                below = [table[p] for p in descendants(table, [pid])]
                return table[pid], below
        return None

    def starting_engine(self) -> tuple[Proc, list[Proc]] | None:
        """An llm replica inside ``AsyncLLM.from_engine_args``: its engine started, the app not ready yet."""
        found = self.replica_with_engine()
        return found if found and not self.healthy() else None

    def serving_replica(self, app: str = "llm") -> tuple[Proc, list[Proc]]:
        """The replica of ``app`` serving, and its engine: for the llm app, once it is ready (a case before may have
        made Serve start a new replica); the embedding app's replica stays up meanwhile."""
        if app == "llm":
            self.wait_healthy()
        return wait_until(
            lambda: self.replica_with_engine(app), 60, f"the serving {app} replica's engine", interval=0.5
        )

    def burst(self, requests: int = 48) -> subprocess.Popen:
        """Requests of 128 output tokens at once to the llm app (48: a minute's work or more on 2 cores), from a
        subprocess."""
        out = (self.server.log.parent / "burst.log").open("w")
        helper = subprocess.Popen([sys.executable, "-c", BURST, self.url, str(requests)], stdout=out, stderr=out)
        self.helpers.append(helper)
        return helper

    def wait_requests_inside(self) -> None:
        """Until the replica holds requests (the burst is in flight)."""

        def inside() -> bool:
            try:
                return httpx.get(f"{self.url}/stats", timeout=10).json()["requests"]["ongoing"] > 0
            except (httpx.HTTPError, ValueError, KeyError):
                return False

        wait_until(inside, 120, "the burst to reach the replica", interval=0.5)

    def driver(self, code: str, *args: str) -> str:
        """Run ``code`` as a Ray driver connected to this cluster (a subprocess: see the module docstring)."""
        return self.server.driver(code, *args, timeout_s=300)

    def finish(self) -> None:
        """Stop the clients it started."""
        for helper in self.helpers:
            helper.kill()
            helper.wait()


def assert_gone(engine: list[Proc], since: str, bound: float = ENGINE_GONE_S) -> float:
    """Every process of ``engine`` exits within ``bound`` seconds; records (in the run's figures) and returns
    how long it took."""
    assert engine, "no engine process to watch"
    started = time.monotonic()
    deadline = started + bound
    while left := alive(engine):
        if time.monotonic() > deadline:
            raise AssertionError(f"{since}, after {bound:.0f} s these still run: {left}")
        time.sleep(0.1)
    took = round(time.monotonic() - started, 1)
    FIGURES.setdefault("engine cleanup: seconds until gone", {})[re.sub(r" \d+", "", since)] = took
    return took


@pytest.fixture
def real_run(real_app_to_end) -> Iterator[Run]:
    """The session's real app, for a case that leaves it killed or ended."""
    run = Run(real_app_to_end.server)
    yield run
    run.finish()


@pytest.fixture(scope="module")
def own_run_to_end(tmp_path_factory) -> Iterator[Run]:
    """`serve run` of the generation app alone (the embedding app and its engine play no part here), started when
    the module's first case that needs it begins (so that its first replica is still starting), ended by the last."""
    pytest.importorskip("vllm", reason="needs the cpu extra (make setup installs it)")
    from serve_app.models import prepare

    prepare()
    run = Run(serve_run(tmp_path_factory.mktemp("own-run"), embeddings=None))
    yield run
    run.finish()
    run.server.stop()


SPAWNED_UNDER_IGNORED_SIGINT = """
import signal, subprocess, sys
from harness.procs import spawn
signal.signal(signal.SIGINT, signal.SIG_IGN)  # as a background job of a non-interactive shell starts a test run
probe = "import signal; print(signal.getsignal(signal.SIGINT) is signal.default_int_handler)"
spawned = spawn([sys.executable, "-c", probe], stdout=subprocess.PIPE, text=True).communicate(timeout=60)[0]
plain = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60).stdout
print(spawned.strip(), plain.strip())
"""


def test_servers_start_with_sigint_acted_on_even_where_the_test_run_ignores_it():
    """A server started for a test (or a benchmark) gets SIGINT at its default, as under a terminal, so Ctrl-C
    reaches it even where the test run itself ignores SIGINT; a plain child keeps it ignored (what made the Ctrl-C
    case below fail in runs started as background jobs: ``serve run`` never saw the signal)."""
    out = subprocess.run([sys.executable, "-c", SPAWNED_UNDER_IGNORED_SIGINT], cwd=ROOT, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["True", "False"], out.stdout


def ray_stop_force(run: Run) -> list[Proc]:
    """What `ray stop --force` does, to this cluster only: SIGKILL, all at once, to each of its processes that
    Ray's own list (``RAY_PROCESSES``: the raylet, the GCS, the workers ``ray::...``, the agents, the dashboard,
    the log monitor) names, by its name or its command line as `ray stop` matches them."""
    from ray.autoscaler._private.constants import RAY_PROCESSES

    def named(proc: Proc) -> bool:
        try:
            comm = Path(f"/proc/{proc.pid}/comm").read_text().strip()
        except OSError:
            return False
        return any(keyword in (comm if by_name else proc.title) for keyword, by_name in RAY_PROCESSES)

    doomed = [proc for proc in processes(run.server.marker).values() if named(proc)]
    for proc in doomed:
        with contextlib.suppress(ProcessLookupError):
            os.kill(proc.pid, signal.SIGKILL)
    return doomed


@pytest.mark.system
def test_serve_delete_during_a_burst_leaves_no_engine(real_run):
    """``serve.delete`` of an app with inputs inside its engine: once the app is deleted (Serve drained the replica,
    or force-killed it after its graceful_shutdown_timeout_s), its engine is gone too. The embedding app's (vLLM's
    pooling engine, started and stopped as the generation app's is), so that the generation app stays for the
    Ctrl-C case after it."""
    run = real_run
    replica, engine = run.serving_replica("embeddings")
    run.driver(DELETE_WHEN_BUSY, "embeddings", EMBEDDED, "4")  # the driver sends the burst itself
    assert_gone([replica], "serve.delete of the embedding app returned", bound=10)
    assert_gone(engine, "serve.delete of the embedding app during a burst")


@pytest.mark.system
def test_ctrl_c_twice_on_serve_run_leaves_no_engine(real_run):
    """Ctrl-C on `serve run` during a burst, and again while it shuts down (it waits for the replicas to
    drain): the second one aborts the shutdown, and still no engine is left."""
    run = real_run
    _, engine = run.serving_replica()
    run.burst()
    run.wait_requests_inside()
    os.killpg(run.server.proc.pid, signal.SIGINT)  # Ctrl-C signals the terminal's foreground process group
    wait_until(
        lambda: "shutting down" in run.log_text(),
        30,
        "serve run to start shutting down",
        detail=lambda: f"; serve run's exit status: {run.server.proc.poll()}; its log:\n{run.log_text()[-4000:]}",
    )
    os.killpg(run.server.proc.pid, signal.SIGINT)
    assert_gone(engine, "Ctrl-C twice on serve run")
    wait_until(run.exited, ENGINE_GONE_S, "serve run to exit")


@pytest.mark.system
def test_replica_killed_while_its_engine_starts_leaves_no_engine(own_run_to_end):
    """SIGKILL of the replica's worker, then ``ray.kill`` of the next replica's actor, each inside
    ``AsyncLLM.from_engine_args`` (its EngineCore up, the app not ready): the engine goes with the replica."""
    run = own_run_to_end
    serving = None
    if run.healthy():  # the app is up already: make Serve start a replica to kill
        serving = run.serving_replica()[0].pid
        os.kill(serving, signal.SIGKILL)
    replica, engine = wait_until(  # not the one just killed, whose engine may not be gone yet
        lambda: (found := run.starting_engine()) and found[0].pid != serving and found,
        SERVE_RUN_START_S,
        "an llm replica's engine to start",
    )
    os.kill(replica.pid, signal.SIGKILL)
    assert_gone(engine, f"SIGKILL of replica {replica.pid} while its engine started")

    # Serve replaces it: kill the next one through Ray while its engine starts.
    second, engine = wait_until(
        lambda: (found := run.starting_engine()) and found[0].pid != replica.pid and found,
        SERVE_RUN_START_S,
        "the replacement replica's engine to start",
    )
    killed = run.driver(
        "import ray\n"
        "ray.init(log_to_driver=False)\n"
        "for actor in ray.util.list_named_actors(all_namespaces=True):\n"
        "    if actor['name'].startswith('SERVE_REPLICA::llm#'):\n"
        "        try:\n"
        "            handle = ray.get_actor(actor['name'], namespace=actor['namespace'])\n"
        "        except ValueError:  # the replica killed above, not yet deregistered\n"
        "            continue\n"
        "        ray.kill(handle, no_restart=True)\n"
        "        print(actor['name'])\n"
    )
    assert killed.strip(), "no llm replica actor to kill"
    assert_gone(engine, f"ray.kill of replica {second.pid} while its engine started")
    assert not run.exited()


@pytest.mark.system
def test_ray_stop_force_during_a_burst_leaves_no_engine_and_frees_the_port(own_run_to_end):
    """`ray stop --force` with requests inside the engine: the raylet dies with the replica, so Ray's own cleanup
    (the raylet killing the replica's process group) cannot run; the replica's engine reaper does it
    (serve_app/engines/reaper.py). Before it, the EngineCore and its worker ran on, orphaned. The same held for
    HAProxy (serve.env), Serve's HAProxyManager's child: it ran on holding the HTTP port, and the next `serve run`
    failed to bind it; it now exits with its manager (serve_app/serving/haproxy_guard.py)."""
    run = own_run_to_end
    replica, engine = run.serving_replica()
    run.burst()
    run.wait_requests_inside()
    haproxy = [proc for proc in processes(run.server.marker).values() if proc.title.split()[0].endswith("/haproxy")]
    port = int(run.url.rsplit(":", 1)[1])
    assert haproxy and port_taken(port), "HAProxy (serve.env) holds the app's HTTP port"
    doomed = ray_stop_force(run)
    assert replica.pid in {proc.pid for proc in doomed} and any("raylet" in proc.title for proc in doomed)
    ours = {p.pid for p in engine + haproxy}
    assert not any(proc.pid in ours for proc in doomed)  # neither the engine nor HAProxy is Ray's to name
    assert_gone(engine, "ray stop --force during a burst")
    assert_gone(haproxy, "ray stop --force: HAProxy")
    wait_until(lambda: not port_taken(port), ENGINE_GONE_S, "the HTTP port to be free")

"""No vLLM engine process outlives its replica (issue item 8), with the real engine and the bundled model.

A replica's engine is its Ray worker's child ``VLLM::EngineCore`` (and that one's ``VLLM::Worker``): it holds the KV
cache's memory, on a GPU the GPU's, so a leaked one keeps a replacement replica from starting. vLLM's EngineCore
does not notice its owner dying; Ray kills it (``serve.env``: per-worker process groups and children killed on
worker exit), or, where the raylet goes first, the replica's engine reaper (serve_app/engines/reaper.py). Each case
kills a replica the way a user or Serve does, against `serve run serve_config.yaml` started as a user does
(``serve.env`` applied, a private ``RAY_TMPDIR``, this process never connecting to that cluster: drivers run as
subprocesses), and waits, with a bound, for every process below that replica to be gone:

- a replica killed (SIGKILL of its worker, then ``ray.kill`` of its actor) while its engine starts;
- ``serve.delete`` of the app during a burst of requests;
- Ctrl-C twice on ``serve run`` during a burst (the second while it shuts down);
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
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest

from benchmarks.environment import serve_env
from benchmarks.procs import (
    Proc,
    alive,
    descendants,
    engine_of,
    gcs_address,
    port_taken,
    processes,
    replicas,
    spawn,
    stop,
)

from .conftest import FIGURES, free_port, wait_until

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent
ENGINE_GONE_S = 30.0  # the bound: no engine process outlives its replica by more
START_S = 420.0  # `serve run` up to a ready app on 2 busy cores
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

DELETE_LLM = """
import time, ray
from ray import serve
ray.init(log_to_driver=False)
assert "llm" in serve.status().applications, serve.status().applications
try:
    serve.delete("llm")  # blocks until Serve has stopped the app's replicas, up to 60 s
except TimeoutError:  # draining past that: Serve force-kills the replica at graceful_shutdown_timeout_s
    deadline = time.monotonic() + 120
    while "llm" in serve.status().applications and time.monotonic() < deadline:
        time.sleep(0.5)
"""


@dataclass
class ServeRun:
    """`serve run serve_config.yaml` in its own Ray cluster, as `make serve` runs it."""

    proc: subprocess.Popen
    marker: str  # its private RAY_TMPDIR, in the environment of every process of the cluster
    url: str
    env: dict[str, str]
    log: Path
    helpers: list[subprocess.Popen] = field(default_factory=list)

    def log_text(self) -> str:
        return self.log.read_text(errors="replace")

    def healthy(self) -> bool:
        try:
            return httpx.get(f"{self.url}/healthz", timeout=5).status_code == 200
        except httpx.HTTPError:
            return False

    def wait_healthy(self) -> None:
        wait_until(lambda: self.healthy() or self.exited(), START_S, "the llm app to be ready", interval=1)
        assert not self.exited(), f"serve run exited:\n{self.log_text()[-5000:]}"

    def exited(self) -> bool:
        return self.proc.poll() is not None

    def replica_with_engine(self) -> tuple[Proc, list[Proc]] | None:
        """An llm replica that has started its engine, and the processes below it (EngineCore, its Worker, and
        multiprocessing's resource tracker and the engine reaper): by parentage, as vLLM's process titles are not
        always set yet."""
        table = processes(self.marker)
        for pid in replicas(table, "llm"):
            if engine_of(table, pid):
                below = [table[p] for p in descendants(table, [pid])]
                return table[pid], below
        return None

    def starting_engine(self) -> tuple[Proc, list[Proc]] | None:
        """An llm replica inside ``AsyncLLM.from_engine_args``: its engine started, the app not ready yet."""
        found = self.replica_with_engine()
        return found if found and not self.healthy() else None

    def serving_replica(self) -> tuple[Proc, list[Proc]]:
        """The llm replica serving (the app ready), and its engine."""
        self.wait_healthy()
        return wait_until(self.replica_with_engine, 60, "the serving llm replica's engine", interval=0.5)

    def burst(self, requests: int = 48) -> subprocess.Popen:
        """Requests of 128 output tokens at once (a minute's work or more on 2 cores), from a subprocess."""
        out = (self.log.parent / "burst.log").open("w")
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

    def driver(self, code: str) -> str:
        """Run ``code`` as a Ray driver connected to this cluster (a subprocess: see the module docstring), by
        its GCS address: "auto" may find another cluster on the machine."""
        address = gcs_address(self.marker)
        assert address, "no raylet of this cluster names its GCS address"
        env = {**self.env, "RAY_ADDRESS": address, "RAY_AUTH_MODE": "token"}
        result = subprocess.run(
            [sys.executable, "-c", code], env=env, cwd=ROOT, capture_output=True, text=True, timeout=180
        )
        assert result.returncode == 0, result.stderr[-3000:]
        return result.stdout


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


def start_serve_run(work: Path) -> ServeRun:
    """`serve run serve_config.yaml` (only the HTTP port moved off 8000) with serve.env's settings."""
    port = free_port()
    config = work / "serve_config.yaml"
    config.write_text(re.sub(r"port: 8000", f"port: {port}", (ROOT / "serve_config.yaml").read_text(), count=1))
    marker = tempfile.mkdtemp(prefix="rt", dir="/tmp")  # short: Ray's socket paths must stay < 108 chars
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "RAY_USAGE_STATS_ENABLED": "0", "RAY_TMPDIR": marker}
    env["PYTHONUNBUFFERED"] = "1"  # a terminal shows each line at once; a file would get them in 8 kB blocks
    env.update(serve_env())  # what make serve runs with
    env.pop("RAY_ADDRESS", None)
    log = work / "serve.log"
    with log.open("w") as out:
        proc = spawn(
            [str(BIN / "serve"), "run", str(config)],
            cwd=ROOT,
            env={**env, "RAY_ADDRESS": "local"},
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    return ServeRun(proc, marker, f"http://127.0.0.1:{port}", env, log)


def finish(run: ServeRun) -> None:
    """Stop the run and whatever of its cluster is left."""
    for helper in run.helpers:
        helper.kill()
        helper.wait()
    stop(run.proc, run.marker)


@pytest.fixture(scope="module")
def prepared() -> None:
    pytest.importorskip("vllm", reason="needs the cpu extra (make setup installs it)")
    from serve_app.models import prepare

    prepare()


@pytest.fixture(scope="module")
def shared_run(prepared, tmp_path_factory) -> Iterator[ServeRun]:
    """One cluster for the cases that leave it running (a killed replica is replaced; a deleted app only ends
    the module): the second case starts from whatever the first left, as a user's cluster would."""
    run = start_serve_run(tmp_path_factory.mktemp("serve"))
    yield run
    finish(run)


@pytest.fixture
def own_run(prepared, tmp_path_factory) -> Iterator[ServeRun]:
    """A cluster of its own, for a case that ends it (first in the module, so two clusters never overlap)."""
    run = start_serve_run(tmp_path_factory.mktemp("serve"))
    yield run
    finish(run)


SPAWNED_UNDER_IGNORED_SIGINT = """
import signal, subprocess, sys
from benchmarks.procs import spawn
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


def test_ctrl_c_twice_on_serve_run_leaves_no_engine(own_run):
    """Ctrl-C on `serve run` during a burst, and again while it shuts down (it waits for the replicas to
    drain): the second one aborts the shutdown, and still no engine is left."""
    run = own_run
    _, engine = run.serving_replica()
    run.burst()
    run.wait_requests_inside()
    os.killpg(run.proc.pid, signal.SIGINT)  # Ctrl-C signals the terminal's foreground process group
    wait_until(
        lambda: "shutting down" in run.log_text(),
        30,
        "serve run to start shutting down",
        detail=lambda: f"; serve run's exit status: {run.proc.poll()}; its log:\n{run.log_text()[-4000:]}",
    )
    os.killpg(run.proc.pid, signal.SIGINT)
    assert_gone(engine, "Ctrl-C twice on serve run")
    wait_until(run.exited, ENGINE_GONE_S, "serve run to exit")


def ray_stop_force(run: ServeRun) -> list[Proc]:
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

    doomed = [proc for proc in processes(run.marker).values() if named(proc)]
    for proc in doomed:
        with contextlib.suppress(ProcessLookupError):
            os.kill(proc.pid, signal.SIGKILL)
    return doomed


def test_ray_stop_force_during_a_burst_leaves_no_engine_and_frees_the_port(own_run):
    """`ray stop --force` with requests inside the engine: the raylet dies with the replica, so Ray's own cleanup
    (the raylet killing the replica's process group) cannot run; the replica's engine reaper does it
    (serve_app/engines/reaper.py). Before it, the EngineCore and its worker ran on, orphaned. The same held for
    HAProxy (serve.env), Serve's HAProxyManager's child: it ran on holding the HTTP port, and the next `serve run`
    failed to bind it; it now exits with its manager (serve_app/serving/haproxy_guard.py)."""
    run = own_run
    replica, engine = run.serving_replica()
    run.burst()
    run.wait_requests_inside()
    haproxy = [proc for proc in processes(run.marker).values() if proc.title.split()[0].endswith("/haproxy")]
    port = int(run.url.rsplit(":", 1)[1])
    assert haproxy and port_taken(port), "HAProxy (serve.env) holds the app's HTTP port"
    doomed = ray_stop_force(run)
    assert replica.pid in {proc.pid for proc in doomed} and any("raylet" in proc.title for proc in doomed)
    ours = {p.pid for p in engine + haproxy}
    assert not any(proc.pid in ours for proc in doomed)  # neither the engine nor HAProxy is Ray's to name
    assert_gone(engine, "ray stop --force during a burst")
    assert_gone(haproxy, "ray stop --force: HAProxy")
    wait_until(lambda: not port_taken(port), ENGINE_GONE_S, "the HTTP port to be free")


def test_replica_killed_while_its_engine_starts_leaves_no_engine(shared_run):
    """SIGKILL of the replica's worker, then ``ray.kill`` of the next replica's actor, each inside
    ``AsyncLLM.from_engine_args`` (its EngineCore up, the app not ready): the engine goes with the replica."""
    run = shared_run
    if run.healthy():  # run alone after the cluster came up: make Serve start a replica to kill
        os.kill(run.serving_replica()[0].pid, signal.SIGKILL)
    replica, engine = wait_until(run.starting_engine, START_S, "an llm replica's engine to start")
    os.kill(replica.pid, signal.SIGKILL)
    assert_gone(engine, f"SIGKILL of replica {replica.pid} while its engine started")

    # Serve replaces it: kill the next one through Ray while its engine starts.
    second, engine = wait_until(
        lambda: (found := run.starting_engine()) and found[0].pid != replica.pid and found,
        START_S,
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


def test_serve_delete_during_a_burst_leaves_no_engine(shared_run):
    """``serve.delete`` of the llm app with requests inside its engine: once the app is deleted (Serve drained
    the replica, or force-killed it after its graceful_shutdown_timeout_s), its engine is gone too."""
    run = shared_run
    replica, engine = run.serving_replica()
    run.burst()
    run.wait_requests_inside()
    run.driver(DELETE_LLM)
    assert_gone([replica], "serve.delete of the llm app returned", bound=10)
    assert_gone(engine, "serve.delete of the llm app during a burst")

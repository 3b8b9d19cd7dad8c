"""Servers in subprocesses, started as their users start them: each in a process group of its own with a private
``RAY_TMPDIR`` (a marker every process it starts inherits, so nothing it leaves is missed), its output in a log, ready
once a check passes, stopped with everything it started. :func:`serve_run` is the one launcher of ``serve run
serve_config.yaml`` for the tests and the benchmarks; :func:`private_cluster_result` runs a script that starts a Ray
cluster of its own."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from . import tiers
from .environment import BIN, ROOT, http_status, last_error, offline_env, serve_env, tail
from .ports import free_port
from .procs import gcs_address, spawn, stop

SERVE_RUN_START_S = 420.0
"""`serve run` up to a ready app on 2 busy cores, both vLLM engines starting at once."""


class ServerFailed(RuntimeError):
    """A server exited, or was not ready in time; the message has its log's telling line."""


def new_marker() -> str:
    """A private ``RAY_TMPDIR``: short, as Ray's socket paths must stay under 108 characters."""
    return tempfile.mkdtemp(prefix="rt", dir="/tmp")


@dataclass
class Server:
    """A server subprocess (its process group), the marker in its processes' environment, its base URL and log."""

    proc: subprocess.Popen
    marker: str
    url: str
    env: dict[str, str]
    log: Path
    started: float

    def log_text(self, chars: int | None = None) -> str:
        text = self.log.read_text(errors="replace")
        return text if chars is None else text[-chars:]

    def exited(self) -> bool:
        return self.proc.poll() is not None

    def wait_ready(self, ready: Callable[[Server], bool], timeout_s: float, interval_s: float = 2.0) -> float:
        """Poll ``ready(self)`` until it holds; the seconds since the start. Raises :class:`ServerFailed` if the
        server exits or ``timeout_s`` pass first."""
        while not ready(self):
            if self.exited():
                raise ServerFailed(f"exited with {self.proc.returncode}: {last_error(tail(self.log))}")
            if time.monotonic() - self.started > timeout_s:
                raise ServerFailed(f"not ready in {timeout_s:.0f} s: {last_error(tail(self.log))}")
            time.sleep(interval_s)
        return time.monotonic() - self.started

    def driver_env(self) -> dict[str, str]:
        """The environment of a Ray driver for this server's cluster: its GCS address (``address="auto"`` may find
        another cluster on the machine) and Ray's token authentication, which ``serve run``'s cluster has on."""
        address = gcs_address(self.marker)
        if not address:
            raise ServerFailed(f"no raylet of this cluster names its GCS address: {last_error(tail(self.log))}")
        return {**self.env, "RAY_ADDRESS": address, "RAY_AUTH_MODE": "token"}

    def driver(self, code: str, *args: str, timeout_s: float = 300) -> str:
        """Run ``python -c code *args`` as a Ray driver of this cluster; its standard output. Raises
        :class:`ServerFailed` with the end of its standard error when it fails."""
        done = subprocess.run(
            [sys.executable, "-c", code, *args],
            cwd=ROOT,
            env=self.driver_env(),
            capture_output=True,
            text=True,
            timeout=timeout_s,
        )
        if done.returncode != 0:
            raise ServerFailed(f"the driver exited with {done.returncode}:\n{done.stderr[-4000:]}")
        return done.stdout

    def stop(self) -> list[int]:
        """Ctrl-C, then whatever of it is left (see :func:`harness.procs.stop`); the pids that had to be killed."""
        return stop(self.proc, self.marker)


def start(argv: list[str], port: int, log: Path, env: dict[str, str], marker: str | None = None) -> Server:
    """Start ``argv`` (a server that will listen on ``port``) in a process group of its own, its output in ``log``,
    with ``env`` and a private ``RAY_TMPDIR``. Only a ``system`` or ``soak`` test may start one."""
    tiers.require("system", f"a server ({Path(argv[0]).name} ...)")
    marker = marker or new_marker()
    env = {**env, "RAY_TMPDIR": marker, "PYTHONUNBUFFERED": "1"}  # a log gets each line at once, not 8 kB blocks
    with log.open("w") as out:
        proc = spawn(argv, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT)
    return Server(proc, marker, f"http://127.0.0.1:{port}", env, log, time.monotonic())


@contextmanager
def running(
    argv: list[str],
    port: int,
    log: Path,
    env: dict[str, str],
    ready: Callable[[Server], bool],
    startup_timeout_s: float,
) -> Iterator[Server]:
    """:func:`start`, wait until ``ready``, yield the server; stop it and its leftovers however the block ends."""
    server = start(argv, port, log, env)
    try:
        server.wait_ready(ready, startup_timeout_s)
        yield server
    finally:
        server.stop()


def vllm_server(model: Path | str, name: str, port: int, *args: str) -> list[str]:
    """The command of vLLM's OpenAI server serving ``model`` as ``name`` on 127.0.0.1:``port``, with ``args`` after
    (its module: the ``vllm`` entry point fails on vLLM's CPU build)."""
    server = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", str(model)]
    return [*server, "--served-model-name", name, "--host", "127.0.0.1", "--port", str(port), *args]


# -- `serve run serve_config.yaml` ---------------------------------------------------------------------------------

LLM_APP, EMBEDDINGS_APP = "serve_app.app:build_app", "serve_app.app:build_embeddings_app"
KEEP: Any = object()
""":func:`serve_config`'s ``embeddings`` default: the embedding application as the file has it."""


def merged(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    """``base`` with ``over`` on top, each section (a dict value) merged one level down."""
    out = dict(base)
    for key, value in over.items():
        out[key] = {**(out.get(key) or {}), **value} if isinstance(value, dict) else value
    return out


def serve_config(port: int, dest: Path, llm: dict[str, Any] | None = None, embeddings: Any = KEEP) -> Path:
    """``serve_config.yaml`` written to ``dest`` with the HTTP port moved to ``port``, ``llm`` merged over the
    generation app's ``args`` and ``embeddings`` over the embedding app's (None leaves the embedding app out, and the
    generation app's ``embeddings_app`` with it)."""
    import yaml

    config = yaml.safe_load((ROOT / "serve_config.yaml").read_text())
    config["http_options"] = {**config.get("http_options", {}), "port": port}
    apps = []
    for app in config["applications"]:
        if app["import_path"] == LLM_APP:
            app["args"] = merged(app.get("args") or {}, llm or {})
            if embeddings is None:
                app["args"].pop("embeddings_app", None)
        elif app["import_path"] == EMBEDDINGS_APP:
            if embeddings is None:
                continue
            if embeddings is not KEEP:
                app["args"] = merged(app.get("args") or {}, embeddings)
        apps.append(app)
    config["applications"] = apps
    dest.write_text(yaml.safe_dump(config, sort_keys=False))
    return dest


def healthy(server: Server) -> bool:
    """The generation app answers its health check."""
    return http_status(f"{server.url}/healthz") == 200


def serve_run(
    workdir: Path,
    llm: dict[str, Any] | None = None,
    embeddings: Any = KEEP,
    env: dict[str, str] | None = None,
) -> Server:
    """Start ``serve run serve_config.yaml`` as ``make serve`` does (``serve.env`` applied, a cluster of its own) on a
    free port, with :func:`serve_config`'s overrides and ``env`` over the environment; not waited for (see
    :func:`healthy`). Its config and log go to ``workdir``."""
    port = free_port()
    config = serve_config(port, workdir / "serve_config.yaml", llm, embeddings)
    full_env = {**offline_env(), **serve_env(), **(env or {}), "RAY_ADDRESS": "local"}
    server = start([str(BIN / "serve"), "run", str(config)], port, workdir / "serve.log", full_env)
    server.env.pop("RAY_ADDRESS")  # what a client of this server inherits: not "local"
    return server


def dashboard_address(server: Server) -> str:
    """The dashboard's URL, from `serve run`'s "View the dashboard at ..." line (colour codes dropped)."""
    text = server.log_text()
    match = re.search(r"View the dashboard at\s*(?:\x1b\[[0-9;]*m)*(http://[0-9.]+:[0-9]+)", text)
    if not match:
        raise ServerFailed(f"serve run did not name its dashboard:\n{text[-3000:]}")
    return match.group(1)


# -- Scripts that start a Ray cluster of their own -----------------------------------------------------------------


def private_cluster_result(args: list[str], timeout_s: float) -> dict[str, Any]:
    """Run ``python *args`` (a script that starts a local Ray cluster of its own, where the caller may belong to
    another) with a private ``RAY_TMPDIR``, stop it and its cluster, and return the JSON of its last ``RESULT {...}``
    line. Raises :class:`ServerFailed` with the end of its output when there is none."""
    tiers.require("system", "a Ray cluster of its own")
    marker = new_marker()
    env = {**offline_env(), "RAY_TMPDIR": marker}
    proc = spawn(
        [sys.executable, *args], cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    try:
        output, _ = proc.communicate(timeout=timeout_s)
    finally:
        stop(proc, marker)
    lines = [line for line in output.splitlines() if line.startswith("RESULT ")]
    if not lines:
        raise ServerFailed(f"no RESULT line:\n{output[-5000:]}")
    return json.loads(lines[-1].removeprefix("RESULT "))

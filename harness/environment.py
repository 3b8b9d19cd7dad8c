"""The project's paths and the environment its servers run in: offline, ``serve.env``'s Ray settings (as ``make
serve`` applies them), and reading a server's log. It imports nothing of Ray: :func:`use_serve_env` must run before
``ray.serve`` is imported."""

from __future__ import annotations

import json
import os
import re
import sys
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from .ports import free_port

ROOT = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent


def offline_env() -> dict[str, str]:
    """This process's environment for a server or client it starts: no hub, no usage reporting, not the caller's
    Ray cluster."""
    out = {**os.environ, "HF_HUB_OFFLINE": "1", "RAY_USAGE_STATS_ENABLED": "0"}
    out.pop("RAY_ADDRESS", None)
    return out


HAPROXY_SIDE_PORTS = ("RAY_SERVE_HAPROXY_STATS_PORT", "RAY_SERVE_HAPROXY_METRICS_PORT")
"""Where Ray's HAProxy serves its stats page and Prometheus metrics: fixed ports (8404, 9101) on every interface, so a
second Serve cluster on one machine (a test or a benchmark beside ``make serve``) fails to start HAProxy there."""


def serve_env() -> dict[str, str]:
    """The Ray Serve settings ``make serve`` runs with (``serve.env``; a value starting with ``./`` is a path in
    this project, made absolute as the Makefile does). HAProxy's side ports are free ones
    (:data:`HAPROXY_SIDE_PORTS`, unless the environment sets them), so the cluster starts beside another."""
    lines = (line.strip() for line in (ROOT / "serve.env").read_text().splitlines())
    settings = dict(line.split("=", 1) for line in lines if line and not line.startswith("#"))
    out = {name: f"{ROOT}/{value[2:]}" if value.startswith("./") else value for name, value in settings.items()}
    for name in HAPROXY_SIDE_PORTS:
        out[name] = os.environ.get(name) or str(free_port(""))
    return out


def use_serve_env() -> None:
    """Put :func:`serve_env` in this process's environment, for every Ray process it starts to inherit. Call it
    before anything imports ``ray.serve``, which reads ``RAY_SERVE_ENABLE_HA_PROXY`` once, at import (the app's
    build then checks for HAProxy)."""
    os.environ.update(serve_env())


def http_status(url: str, timeout: float = 5.0) -> int | None:
    """The status ``GET url`` answers with; None when nothing answers."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:
            return response.status
    except urllib.error.HTTPError as exc:
        return exc.code
    except (OSError, ValueError):
        return None


def post_json(url: str, body: dict[str, Any], timeout: float = 30.0) -> tuple[int | None, Any]:
    """``POST url`` with a JSON body: the status and the parsed answer, the start of an error's body for an HTTP
    error, or None and the reason when nothing answers."""
    request = urllib.request.Request(url, json.dumps(body).encode(), {"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()[:300]
    except (OSError, ValueError) as exc:
        return None, str(exc)


def tail(path: Path, chars: int = 3000) -> str:
    try:
        return path.read_text(errors="replace")[-chars:]
    except OSError:
        return ""


def last_error(text: str) -> str:
    """The most telling line of a log tail: the last one that names an error, else the last line."""
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    for line in reversed(lines):
        if re.search(r"(Error|Exception|error:|failed|Traceback)", line):
            return line[:300]
    return lines[-1][:300] if lines else "no output"

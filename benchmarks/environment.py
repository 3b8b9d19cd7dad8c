"""What every benchmark that starts a server in a subprocess shares: the project's paths, the bundled model's name
and dtype, each peer's environment (``serve.env``'s Ray settings, free ports) and reading its log. It imports
nothing of Ray: :func:`use_serve_env` must run before ``ray.serve`` is imported."""

from __future__ import annotations

import os
import random
import re
import socket
import sys
import time
import urllib.error
import urllib.request
from contextlib import suppress
from pathlib import Path

from serve_app.engines.cpu import cpu_dtype

ROOT = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent
MODEL_NAME = "SmolLM2-135M-Instruct"
DTYPE = cpu_dtype()  # what the app computes in here (`vllm.dtype: auto`), so every peer is measured in it
NO_HAPROXY = {"RAY_SERVE_ENABLE_HA_PROXY": "0"}  # over serve.env: Serve's Python proxy on the HTTP port
PYTHON_PROXY = {**NO_HAPROXY, "RAY_SERVE_ENABLE_DIRECT_INGRESS": "0"}  # and no direct ingress: as before both
ALL_CORES = {"VLLM_CPU_NUM_OF_RESERVED_CPU": "0"}  # vLLM's CPU build then keeps no core for its scheduler


def env() -> dict[str, str]:
    """The environment of every peer and client: no hub, the same KV cache, no usage reporting."""
    out = {**os.environ, "HF_HUB_OFFLINE": "1", "VLLM_CPU_KVCACHE_SPACE": "2", "RAY_USAGE_STATS_ENABLED": "0"}
    out.pop("RAY_ADDRESS", None)
    return out


HAPROXY_SIDE_PORTS = ("RAY_SERVE_HAPROXY_STATS_PORT", "RAY_SERVE_HAPROXY_METRICS_PORT")
"""Where Ray's HAProxy serves its stats page and Prometheus metrics: fixed ports (8404, 9101) on every interface, so a
second Serve cluster on one machine (a test or a benchmark beside ``make serve``) fails to start HAProxy there."""


def serve_env() -> dict[str, str]:
    """The Ray Serve settings ``make serve`` runs with (``serve.env``; a value starting with ``./`` is a path in
    this project, made absolute as the Makefile does): every Ray-based peer gets them. HAProxy's side ports are
    free ones (:data:`HAPROXY_SIDE_PORTS`, unless the environment sets them), so the cluster starts beside another."""
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


RAY_WORKER_PORTS_END = 20000
"""Ray's worker processes listen on 10002-19999 by default (``--min/max-worker-port``): a port is picked above."""
_handed_out: set[int] = set()


def ephemeral_ports() -> tuple[int, int]:
    """The kernel's range of ports for the local end of outgoing connections (Linux's own default elsewhere)."""
    with suppress(OSError, ValueError):
        low, high = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()
        return int(low), int(high)
    return 32768, 60999


def free_port(host: str = "127.0.0.1") -> int:
    """A port nothing listens on at ``host`` (``""``: on any interface) now, below the kernel's ephemeral range
    and above Ray's worker ports, never the same one twice in a process. A port the kernel gives for port 0 lies
    in the ephemeral range, where any process's outgoing connection can take it before the server binds it (CI
    saw Serve's HAProxy fail with "Address already in use" on one); below it only a server binding it by number
    can."""
    low = ephemeral_ports()[0]
    candidates = [port for port in range(RAY_WORKER_PORTS_END, low) if port not in _handed_out]
    for port in random.sample(candidates, min(len(candidates), 200)):
        with socket.socket() as sock:
            try:
                sock.bind((host, port))
            except OSError:
                continue
        _handed_out.add(port)
        return port
    with socket.socket() as sock:  # no room below the range on this machine: the kernel's pick
        sock.bind((host, 0))
        return sock.getsockname()[1]


def http_status(url: str, timeout: float = 5.0) -> int | None:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:
            return response.status
    except urllib.error.HTTPError as exc:
        return exc.code
    except (OSError, ValueError):
        return None


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


def serve_until_interrupted() -> None:
    """Keep a peer's Serve app up in this process until it is interrupted (its benchmark stops it); then shut down."""
    import ray
    from ray import serve

    try:
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        serve.shutdown()
        ray.shutdown()

"""The peers ``benchmarks.embeddings`` compares (the app and its variants, the naive ``@serve.batch`` server, vLLM's
pooling server): their names, the command and environment that start each, waiting until it embeds a text, and
stopping it."""

import json
import os
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from harness import launcher
from harness.environment import ROOT, offline_env, post_json, serve_env, tail
from harness.launcher import Server, vllm_server
from harness.ports import free_port
from serve_app.engines.encoder import bundled_encoder_path

from ..lib.peers import NO_HAPROXY

MODEL_NAME = "all-MiniLM-L6-v2"
PEERS = (
    "app",
    "app-direct",
    "app-python-proxy",
    "app-padded",
    "app-fifo32",
    "naive",
    "naive-app-dtype",
    "vllm",
    "vllm-app-dtype",
)
EXTRA_PEERS = (  # vLLM with its own CPU defaults (one of two cores kept for its scheduler); the padded app with
    # one torch thread (cpu_threads: 1), the HTTP path on the other core; the padded app and the naive server on
    # their replicas' own ports; both engines in float32 whatever the CPU
    "vllm-default",
    "app-padded-1t",
    "app-padded-direct",
    "naive-direct",
    "app-float32",
    "app-padded-float32",
)
APP_DTYPE = "-app-dtype"  # a peer name's suffix: the naive server or vLLM's in the dtype the app computes in here
FIFO32 = {"order": "fifo", "max_batch_size": 32, "target_batch_tokens": 10**9}
APP_VARIANTS: dict[str, dict[str, Any]] = {  # over the app's args
    "app-padded": {"engine": "padded", "batcher": {"mode": "batch"}},
    "app-fifo32": {"engine": "padded", "batcher": {"mode": "batch", **FIFO32}},
    "app-padded-1t": {"engine": "padded", "cpu_threads": 1, "batcher": {"mode": "batch"}},
    "app-float32": {"vllm": {"dtype": "float32"}, "batcher": {}},
    "app-padded-float32": {"engine": "padded", "dtype": "float32", "batcher": {"mode": "batch"}},
}
PYTHON_PROXY = {"app-python-proxy": NO_HAPROXY}  # over serve.env: Serve's Python proxy on the client's port
READY_MARKER = "EMBEDDINGS_BENCH_READY"
DIRECT_MARKER = "EMBEDDINGS_BENCH_DIRECT_URL"
DIRECT = "-direct"  # a peer name's suffix: the client on the app replica's own port (direct ingress)
APP_IMPORT_PATH = "serve_app.app:build_embeddings_app"


def cores() -> int:
    return len(os.sched_getaffinity(0))


def env() -> dict[str, str]:
    """Every peer's environment: no hub, no usage reporting, not the caller's Ray cluster, no tokenizer threads."""
    return {**offline_env(), "TOKENIZERS_PARALLELISM": "false"}


def app_dtype() -> str:
    """What the app's default engine computes in on this machine: serve_config.yaml's ``vllm.dtype``, its
    ``auto`` resolved as the engine resolves it on a CPU."""
    from serve_app.config import EmbeddingConfig
    from serve_app.engines.async_llm import resolve_dtype

    return resolve_dtype(EmbeddingConfig.model_validate(app_args()).vllm.dtype, on_gpu=False)


def app_args(over: dict[str, Any] | None = None) -> dict[str, Any]:
    """The app's ``args``: serve_config.yaml's embedding app (its defaults if it has none) on the CPU, one
    replica, with ``over`` (``engine``, ``batcher`` knobs) over them; a batcher of another mode replaces the
    file's (the engine's defaults fill in the rest)."""
    import yaml

    config = yaml.safe_load((ROOT / "serve_config.yaml").read_text()) or {}
    found = [a for a in config.get("applications", []) if a.get("import_path") == APP_IMPORT_PATH]
    args = dict((found[0].get("args") if found else None) or {})
    args.update(device="cpu", autoscaling={**(args.get("autoscaling") or {}), "min_replicas": 1, "max_replicas": 1})
    over = dict(over or {})
    batcher = over.pop("batcher", None)
    args.update(over)
    if batcher:
        base = args.get("batcher") or {}
        same_mode = batcher.get("mode", base.get("mode")) == base.get("mode")
        args["batcher"] = {**base, **batcher} if same_mode else dict(batcher)
    return args


def peer_command(peer: str, port: int, app_batcher: dict[str, Any] | None = None) -> list[str]:
    if peer.startswith("vllm"):
        dtype = ["--dtype", app_dtype()] if peer.endswith(APP_DTYPE) else []  # else vLLM's own: auto
        pooling = ["--runner", "pooling", "--enforce-eager", "--disable-log-stats", *dtype]
        return vllm_server(bundled_encoder_path(), MODEL_NAME, port, *pooling)
    over: dict[str, Any] = {"batcher": dict(app_batcher or {})}
    peer = peer.removesuffix(DIRECT)  # the same app; ``running`` reads the replica's own port from its log
    peer = "app" if peer in PYTHON_PROXY else peer  # the same app; ``peer_env`` turns HAProxy off
    if peer.endswith(APP_DTYPE):  # naive-app-dtype
        naive = [sys.executable, "-m", "benchmarks.embeddings", "--serve", "naive", "--port", str(port)]
        return [*naive, "--app-args", json.dumps({"dtype": app_dtype()})]
    if peer in APP_VARIANTS:
        variant = APP_VARIANTS[peer]
        peer, over = "app", {**variant, "batcher": {**over["batcher"], **variant["batcher"]}}
    command = [sys.executable, "-m", "benchmarks.embeddings", "--serve", peer, "--port", str(port)]
    return [*command, "--app-args", json.dumps(over)] if peer == "app" else command


def peer_env(peer: str) -> dict[str, str]:
    out = env()
    if peer.startswith("vllm"):
        out["VLLM_CPU_KVCACHE_SPACE"] = "1"
    else:
        out.update(serve_env())  # the Ray peers run with make serve's Ray settings
        out.update(PYTHON_PROXY.get(peer, {}))
    if peer in ("vllm", f"vllm{APP_DTYPE}"):
        out["VLLM_CPU_NUM_OF_RESERVED_CPU"] = "0"
    return out


def get_json(url: str) -> dict[str, Any] | None:
    import urllib.request

    try:
        with urllib.request.urlopen(url, timeout=10) as response:
            return json.loads(response.read())
    except (OSError, ValueError):
        return None


@contextmanager
def running(
    peer: str, workdir: Path, startup_timeout_s: float, app_batcher: dict[str, Any] | None = None
) -> Iterator[tuple[str, float, str]]:
    """Start a peer (:func:`harness.launcher.running`); yield (base url, start-up seconds, the marker in its
    processes' environment) once it embeds a text; stop it and everything it started. Raises
    :class:`harness.launcher.ServerFailed` (a RuntimeError, with its log's telling line) if it does not come up."""

    def ready(server: Server) -> bool:
        if not (peer.startswith("vllm") or READY_MARKER in tail(server.log, 50_000)):
            return False
        status, _ = post_json(f"{server.url}/v1/embeddings", {"model": MODEL_NAME, "input": "hello"})
        return status == 200

    port = free_port()
    argv = peer_command(peer, port, app_batcher)
    with launcher.running(argv, port, workdir / f"{peer}.log", peer_env(peer), ready, startup_timeout_s) as server:
        url = direct_url(tail(server.log, 50_000), server.url) if peer.endswith(DIRECT) else server.url
        yield url, time.monotonic() - server.started, server.marker


def direct_url(log: str, proxy_url: str) -> str:
    """The embedding app replica's own HTTP URL, which the app peer prints once it runs; RuntimeError where there
    is no other than the proxy's (direct ingress off) or more than one."""
    urls = [line.split()[1] for line in log.splitlines() if line.startswith(DIRECT_MARKER)]
    if len(urls) != 1 or urls[0] == proxy_url:
        raise RuntimeError(f"no direct URL for the app's one replica, only {urls}")
    return urls[0]

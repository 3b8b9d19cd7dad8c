"""The OpenAI servers ``benchmarks.serving`` compares (vllm, the app and its variants, Ray Serve LLM): the command
and environment that start each, waiting until it answers, stopping it and its leftovers, and running the app's
batch driver into it. Other benchmarks start their peers with it."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from harness.environment import BIN, ROOT, http_status, last_error, serve_env, tail
from harness.ports import free_port
from harness.procs import spawn, stop

from ..lib.peers import ALL_CORES, DTYPE, MODEL_NAME, PYTHON_PROXY, env, serve_until_interrupted

MAX_MODEL_LEN = 2048
PEERS = (
    "vllm",
    "vllm-all-cores",
    "app",
    "app-all-cores",
    "app-slo",
    "app-small-steps",
    "app-python-proxy",
    "ray-serve-llm",
)
SMALL_STEP_TOKENS = 512  # app-small-steps: vLLM's steps at this many tokens (max_num_batched_tokens; 2048 on a CPU)
APP_VLLM = {  # app peers that change only the app's `vllm` settings
    "app-all-cores": {"cpu_reserved_cores": 0},
    "app-small-steps": {"engine_args": {"max_num_batched_tokens": SMALL_STEP_TOKENS}},
}
SLO_INFLIGHT, SLO_QUEUE_WAIT_S = 32, 4.0  # app-slo's batcher: engine share and admission wait
READY_MARKER = "RAY_SERVE_LLM_READY"


def threads_env() -> dict[str, str]:
    """``ENGINE_THREADS`` from this process's environment, for Ray Serve LLM's engines (where the app takes
    ``vllm.cpu_threads``): empty when unset."""
    threads = os.environ.get("ENGINE_THREADS")
    return {"OMP_NUM_THREADS": threads} if threads else {}


def app_config(
    port: int, dest: Path, batcher: dict[str, Any] | None = None, fleet: dict[str, Any] | None = None
) -> Path:
    """serve_config.yaml with only the HTTP port moved, one replica, the shared dtype (and ``batcher`` knobs;
    ``fleet``: more of the app's args, each section merged over its own: e.g. replicas, router, threads;
    ``embeddings_app: null`` leaves the embedding application out)."""
    import yaml

    text = re.sub(r"port: 8000", f"port: {port}", (ROOT / "serve_config.yaml").read_text(), count=1)
    config = yaml.safe_load(text)
    args = config["applications"][0]["args"]
    if "autoscaling" in args:
        args["autoscaling"] = {**args["autoscaling"], "min_replicas": 1, "max_replicas": 1}
    if args.get("engine", "vllm") == "vllm":
        args["vllm"] = {**(args.get("vllm") or {}), "dtype": DTYPE}
    if batcher:
        args["batcher"] = {**(args.get("batcher") or {}), **batcher}
    for key, value in (fleet or {}).items():
        args[key] = {**(args.get(key) or {}), **value} if isinstance(value, dict) else value
    if args.get("embeddings_app") is None:
        config["applications"] = config["applications"][:1]
    dest.write_text(yaml.safe_dump(config, sort_keys=False))
    return dest


def peer_command(
    peer: str,
    folder: Path,
    port: int,
    workdir: Path,
    batcher: dict[str, Any] | None = None,
    fleet: dict[str, Any] | None = None,
) -> list[str]:
    """The command that starts ``peer`` (``batcher``, ``fleet``: :func:`app_config`'s, ``app`` peers only)."""
    if peer in ("vllm", "vllm-all-cores"):
        return [
            sys.executable,
            "-m",
            "vllm.entrypoints.openai.api_server",
            "--model",
            str(folder),
            "--served-model-name",
            MODEL_NAME,
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--dtype",
            DTYPE,
            "--max-model-len",
            str(MAX_MODEL_LEN),
            "--enforce-eager",
        ]
    if peer in ("app", "app-python-proxy"):  # the latter: the same app, Serve's Python proxy at its door (``running``)
        return [str(BIN / "serve"), "run", str(app_config(port, workdir / "serve_config.yaml", batcher, fleet))]
    if peer in APP_VLLM:  # the app with some of its engine's settings changed
        over = {**(fleet or {}), "vllm": {**(fleet or {}).get("vllm", {}), **APP_VLLM[peer]}}
        return [str(BIN / "serve"), "run", str(app_config(port, workdir / "serve_config.yaml", batcher, over))]
    if peer == "app-slo":
        knobs = {"max_inflight": SLO_INFLIGHT, "max_queue_wait_s": SLO_QUEUE_WAIT_S, **(batcher or {})}
        return [str(BIN / "serve"), "run", str(app_config(port, workdir / "serve_config.yaml", knobs))]
    if peer == "ray-serve-llm":
        return [sys.executable, "-m", "benchmarks.serving", "--ray-serve-llm", str(port), "--model-dir", str(folder)]
    raise ValueError(f"unknown peer {peer!r}")


def is_ready(peer: str, url: str, log: Path) -> bool:
    if peer == "ray-serve-llm":  # serve.run returned (the LLM replica is up) and the proxy routes
        return READY_MARKER in tail(log, 20_000) and http_status(f"{url}/v1/models") == 200
    paths = ("/health",) if peer.startswith("vllm") else ("/health", "/healthz")
    return any(http_status(f"{url}{path}") == 200 for path in paths)


@contextmanager
def running(
    peer: str,
    folder: Path,
    workdir: Path,
    startup_timeout_s: float,
    extra: list[str] | None = None,
    batcher: dict[str, Any] | None = None,
    fleet: dict[str, Any] | None = None,
    extra_env: dict[str, str] | None = None,
) -> Iterator[tuple[str, float, str]]:
    """Start a peer in its own process group (``extra``: more arguments for its command; ``batcher``, ``fleet``:
    :func:`app_config`'s for an app peer; ``extra_env``: more environment); yield (base url, start-up seconds,
    its private ``RAY_TMPDIR``, where a Ray client finds a Ray-based peer's cluster); stop it and its leftovers.
    Raises RuntimeError (with the log's tail) if it exits or is not ready in time."""
    port = free_port()
    log_path = workdir / f"{peer}.log"
    ray_tmp = tempfile.mkdtemp(prefix="rt", dir="/tmp")  # short: Ray's socket paths must stay < 108 chars
    peer_env = {**env(), "RAY_TMPDIR": ray_tmp}
    if peer == "vllm-all-cores":
        peer_env.update(ALL_CORES)
    if not peer.startswith("vllm"):
        peer_env.update(serve_env())
    if peer.startswith("app"):
        peer_env["RAY_ADDRESS"] = "local"
    if peer == "app-python-proxy":
        peer_env.update(PYTHON_PROXY)
    peer_env.update(extra_env or {})
    with log_path.open("w") as log:
        proc = spawn(
            [*peer_command(peer, folder, port, workdir, batcher, fleet), *(extra or [])],
            cwd=ROOT,
            env=peer_env,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    url = f"http://127.0.0.1:{port}"
    started = time.monotonic()
    try:
        while not is_ready(peer, url, log_path):
            if proc.poll() is not None:
                raise RuntimeError(f"exited with {proc.returncode}: {last_error(tail(log_path))}")
            if time.monotonic() - started > startup_timeout_s:
                raise RuntimeError(f"not ready in {startup_timeout_s:.0f} s: {last_error(tail(log_path))}")
            time.sleep(2)
        yield url, time.monotonic() - started, ray_tmp
    finally:
        stop(proc, ray_tmp)


def driver_call(ray_tmp: str, argv: list[str]) -> dict[str, Any]:
    """``subprocess`` arguments for ``python -m serve_app.driver`` with ``argv`` into the app whose cluster is under
    ``ray_tmp``, as a user runs it."""
    command = [str(BIN / "python"), "-m", "serve_app.driver", *argv]
    return {"args": command, "cwd": ROOT, "env": {**env(), "RAY_TMPDIR": ray_tmp}}


def run_driver(ray_tmp: str, argv: list[str], timeout_s: float = 3600) -> dict[str, Any]:
    """:func:`driver_call` run to its end; the summary it prints. Raises RuntimeError with its stderr's tail when it
    fails outright (exit 1, some rows missing, still returns the summary)."""
    done = subprocess.run(**driver_call(ray_tmp, argv), capture_output=True, text=True, timeout=timeout_s)
    start = re.search(r"^\{$", done.stdout, re.M)
    if done.returncode not in (0, 1) or start is None:
        raise RuntimeError(f"driver failed ({done.returncode}): {done.stderr[-6000:]}")
    return json.loads(done.stdout[start.start() :])


def serve_ray_llm(port: int, folder: str, replicas: int = 1, router: str | None = None) -> None:
    """Ray Serve LLM's OpenAI app on CPU, in this process's own Ray cluster, until SIGINT (``replicas`` engines;
    ``router``: a request router class's import path, else Serve's default)."""
    import ray
    from ray import serve
    from ray.serve.llm import LLMConfig, build_openai_app

    config = LLMConfig(
        model_loading_config={"model_id": MODEL_NAME, "model_source": folder},
        accelerator_config={"kind": "cpu"},
        engine_kwargs={"dtype": DTYPE, "max_model_len": MAX_MODEL_LEN, "enforce_eager": True},
        deployment_config={
            "autoscaling_config": {"min_replicas": replicas, "max_replicas": replicas},
            **({"request_router_config": {"request_router_class": router}} if router else {}),
        },
        runtime_env={"env_vars": {"VLLM_CPU_KVCACHE_SPACE": "2", "HF_HUB_OFFLINE": "1", **threads_env()}},
    )
    # Its ingress and LLM replicas each want logical CPUs; they are only bookkeeping on this 2-core machine.
    ray.init(address="local", num_cpus=8, include_dashboard=False)
    serve.start(http_options={"host": "127.0.0.1", "port": port})
    serve.run(build_openai_app({"llm_configs": [config]}), name="llm", route_prefix="/")
    print(READY_MARKER, flush=True)
    serve_until_interrupted()

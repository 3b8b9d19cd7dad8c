"""The OpenAI servers ``benchmarks.serving`` compares (vllm, the app and its variants, Ray Serve LLM): the command,
settings and environment that start each through ``harness.launcher``, waiting until it answers, and running the
app's batch driver into it. Other benchmarks start their peers with it."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from harness.environment import BIN, ROOT, http_status, serve_env, tail
from harness.launcher import KEEP, Server, healthy, merged, serve_run, start, vllm_server
from harness.ports import free_port
from serve_app.engines.async_llm import kv_cache_bytes

from ..lib.peers import ALL_CORES, DTYPE, KV_CACHE_GIB, MODEL_NAME, PYTHON_PROXY, env, serve_until_interrupted

MAX_MODEL_LEN = 2048
PEERS = (
    "vllm",
    "vllm-all-cores",
    "app",
    "app-all-cores",
    "app-slo",
    "app-python-proxy",
    "ray-serve-llm",
)
APP_VLLM = {  # app peers that change only the app's `vllm` settings
    "app-all-cores": {"cpu_reserved_cores": 0},
    "app-one-core": {"cpu_reserved_cores": 1},  # the engine on one core, as vLLM's CPU build ships (fast_engine)
    "app-as-vllm": {"cpu_reserved_cores": 1, "max_num_batched_tokens": None},  # and vLLM's own steps (fast_engine)
}
SLO_INFLIGHT, SLO_QUEUE_WAIT_S = 32, 4.0  # app-slo's batcher: engine share and admission wait
READY_MARKER = "RAY_SERVE_LLM_READY"


def threads_env() -> dict[str, str]:
    """``ENGINE_THREADS`` from this process's environment, for Ray Serve LLM's engines (where the app takes
    ``vllm.cpu_threads``): empty when unset."""
    threads = os.environ.get("ENGINE_THREADS")
    return {"OMP_NUM_THREADS": threads} if threads else {}


def app_overrides(peer: str, batcher: dict[str, Any] | None, fleet: dict[str, Any] | None) -> tuple[dict, Any]:
    """:func:`harness.launcher.serve_config`'s ``llm`` and ``embeddings`` for an app peer: one replica, the shared
    dtype, the base model alone (no ``lora``, as the vLLM peers serve it, unless ``fleet`` names adapters), the peer's
    own settings, ``batcher`` knobs and ``fleet`` (more of the app's args, each section merged over its own: e.g.
    replicas, router, threads; ``embeddings_app: None`` leaves the embedding application out)."""
    fleet = dict(fleet or {})
    embeddings = KEEP
    if "embeddings_app" in fleet and fleet["embeddings_app"] is None:
        embeddings = fleet.pop("embeddings_app")
    if peer == "app-slo":
        batcher = {"max_inflight": SLO_INFLIGHT, "max_queue_wait_s": SLO_QUEUE_WAIT_S, **(batcher or {})}
    one = {
        "autoscaling": {"min_replicas": 1, "max_replicas": 1},
        "vllm": {"dtype": DTYPE, "cpu_kvcache_space_gb": KV_CACHE_GIB},
        "batcher": batcher or {},
        "lora": None,
    }
    llm = merged(one, fleet)
    llm["vllm"] = {**llm["vllm"], **APP_VLLM.get(peer, {})}  # the app with some of its engine's settings changed
    return llm, embeddings


def peer_command(peer: str, folder: Path, port: int) -> list[str]:
    """The command that starts a peer other than the app's (``serve run``: :func:`harness.launcher.serve_run`)."""
    if peer in ("vllm", "vllm-all-cores"):
        return vllm_server(
            folder, MODEL_NAME, port, "--dtype", DTYPE, "--max-model-len", str(MAX_MODEL_LEN), "--enforce-eager"
        )
    if peer == "ray-serve-llm":
        return [sys.executable, "-m", "benchmarks.serving", "--ray-serve-llm", str(port), "--model-dir", str(folder)]
    raise ValueError(f"unknown peer {peer!r}")


def is_ready(peer: str, server: Server) -> bool:
    if peer == "ray-serve-llm":  # serve.run returned (the LLM replica is up) and the proxy routes
        return READY_MARKER in tail(server.log, 20_000) and http_status(f"{server.url}/v1/models") == 200
    return http_status(f"{server.url}/health") == 200 if peer.startswith("vllm") else healthy(server)


def start_peer(
    peer: str,
    folder: Path,
    workdir: Path,
    extra: list[str] | None = None,
    batcher: dict[str, Any] | None = None,
    fleet: dict[str, Any] | None = None,
    extra_env: dict[str, str] | None = None,
) -> Server:
    """Start ``peer``, not waited for: an app peer as ``make serve`` starts the app (:func:`harness.launcher.serve_run`
    over :func:`app_overrides`), the others with :func:`harness.launcher.start` (``extra``: more arguments for their
    command). ``extra_env`` goes over the peer's environment."""
    if peer.startswith("app"):
        proxy = PYTHON_PROXY if peer == "app-python-proxy" else {}  # the same app, Serve's Python proxy at its door
        return serve_run(workdir, *app_overrides(peer, batcher, fleet), env={**proxy, **(extra_env or {})})
    port = free_port()
    peer_env = {**env(), **(ALL_CORES if peer == "vllm-all-cores" else {})}
    if not peer.startswith("vllm"):
        peer_env.update(serve_env())
        peer_env.pop("VLLM_CPU_KVCACHE_SPACE")  # Ray Serve LLM: an engine argument, which the variable would beat
    argv = [*peer_command(peer, folder, port), *(extra or [])]
    return start(argv, port, workdir / f"{peer}.log", {**peer_env, **(extra_env or {})})


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
    """:func:`start_peer`, then yield (base url, start-up seconds, its private ``RAY_TMPDIR``, where a Ray client
    finds a Ray-based peer's cluster) once it answers; stop it and its leftovers however the block ends. Raises
    :class:`harness.launcher.ServerFailed` (a RuntimeError, with the log's telling line) if it exits or is not ready
    in time."""
    server = start_peer(peer, folder, workdir, extra, batcher, fleet, extra_env)
    try:
        startup_s = server.wait_ready(lambda s: is_ready(peer, s), startup_timeout_s)
        yield server.url, startup_s, server.marker
    finally:
        server.stop()


def driver_call(ray_tmp: str, argv: list[str]) -> dict[str, Any]:
    """``subprocess`` arguments for ``python -m serve_app.driver`` with ``argv`` into the app whose cluster is under
    ``ray_tmp``, as a user runs it."""
    command = [str(BIN / "python"), "-m", "serve_app.driver", *argv]
    return {"args": command, "cwd": ROOT, "env": {**env(), "RAY_TMPDIR": ray_tmp}}


def run_driver(ray_tmp: str, argv: list[str], timeout_s: float = 3600) -> dict[str, Any]:
    """:func:`driver_call` run to its end; the summary it prints. Raises RuntimeError with its stderr's tail when it
    fails outright (exit 1, some rows missing, still returns the summary)."""
    done = subprocess.run(**driver_call(ray_tmp, argv), capture_output=True, text=True, timeout=timeout_s)
    summary = re.search(r"^\{$", done.stdout, re.M)
    if done.returncode not in (0, 1) or summary is None:
        raise RuntimeError(f"driver failed ({done.returncode}): {done.stderr[-6000:]}")
    return json.loads(done.stdout[summary.start() :])


def ray_llm_config(
    folder: str,
    replicas: int = 1,
    router: str | None = None,
    kv_cache_gib: float = KV_CACHE_GIB,
    lora: tuple[str, int, int] | None = None,
) -> Any:
    """Ray Serve LLM's ``LLMConfig`` for the bundled model on CPU (``replicas`` engines; ``router``: a request router
    class's import path, else Serve's default; ``kv_cache_gib``: each engine's KV cache; ``lora``: its multiplexed
    LoRA as its users set it, from a cloud folder of adapters with so many loaded per replica and a largest rank, a
    request naming ``<model>:<adapter>``)."""
    from ray.serve.llm import LLMConfig

    lora_config: dict[str, Any] | None = None
    lora_kwargs: dict[str, Any] = {}
    if lora:
        path, slots, rank = lora
        lora_config = {"dynamic_lora_loading_path": path, "max_num_adapters_per_replica": slots}
        lora_kwargs = {"enable_lora": True, "max_loras": slots, "max_cpu_loras": slots, "max_lora_rank": rank}
    store = {k: v for k, v in os.environ.items() if k.startswith("AWS_")}  # where its S3 client finds the folder
    return LLMConfig(
        model_loading_config={"model_id": MODEL_NAME, "model_source": folder},
        accelerator_config={"kind": "cpu"},
        engine_kwargs={
            "dtype": DTYPE,
            "max_model_len": MAX_MODEL_LEN,
            "enforce_eager": True,
            "kv_cache_memory_bytes": kv_cache_bytes(kv_cache_gib),
            "enable_prompt_tokens_details": True,  # usage's cached tokens, as the app reports them: no other change
            **lora_kwargs,
        },
        deployment_config={
            "autoscaling_config": {"min_replicas": replicas, "max_replicas": replicas},
            **({"request_router_config": {"request_router_class": router}} if router else {}),
        },
        runtime_env={"env_vars": {"HF_HUB_OFFLINE": "1", **threads_env(), **store}},
        lora_config=lora_config,
    )


def serve_ray_llm(port: int, config: Any) -> None:
    """Ray Serve LLM's OpenAI app over ``config`` (:func:`ray_llm_config`), in this process's own Ray cluster, until
    SIGINT."""
    import ray
    from ray import serve
    from ray.serve.llm import build_openai_app

    # Its ingress and LLM replicas each want logical CPUs; they are only bookkeeping on this 2-core machine.
    ray.init(address="local", num_cpus=8, include_dashboard=False)
    serve.start(http_options={"host": "127.0.0.1", "port": port})
    serve.run(build_openai_app({"llm_configs": [config]}), name="llm", route_prefix="/")
    print(READY_MARKER, flush=True)
    serve_until_interrupted()

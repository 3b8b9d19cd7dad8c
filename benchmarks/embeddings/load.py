"""The embeddings benchmark's closed-loop client and its vector check: the corpus cut into requests, many clients
posting them in order, and the sampled vectors against sentence-transformers' own ``encode``."""

import asyncio
import json
import math
import os
import statistics
import time
from typing import Any

from harness.stats import percentile
from serve_app.engines.encoder import bundled_encoder_path

from .peers import MODEL_NAME

SCENARIOS = {"single": 1, "list16": 16}
MIN_COSINE = 0.999
SAMPLE = 48  # texts whose vectors are checked, per peer and scenario
REQUESTS_PER_CLIENT = 4  # at least this many requests per client in a measured run (the corpus sent again if need be)


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

"""The app in this process's own Ray cluster, driven through its ``DeploymentHandle``: the batch job through Ray
Data or straight from the handle, and the mixed-length burst."""

from __future__ import annotations

import asyncio
import math
import statistics
import time
from typing import Any

from harness.ports import free_port

from .settings import app_args


def start_app(args: dict[str, Any]):
    import ray
    from ray import serve

    from serve_app.app import build_app

    port = free_port()
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    serve.start(http_options={"host": "127.0.0.1", "port": port})
    handle = serve.run(build_app(args), name="llm", route_prefix="/")
    handle.generate.remote("warm up", max_tokens=2).result()
    return handle


def stop_app() -> None:
    import ray
    from ray import serve

    serve.shutdown()
    ray.shutdown()


def run_app(texts: list[str], max_tokens: int, repeats: int, via_data: bool) -> dict[str, Any]:
    import ray

    from serve_app.data import DEFAULT_BATCH_SIZE, generate

    handle = start_app(app_args())
    walls = []
    chunks = [texts[i : i + DEFAULT_BATCH_SIZE] for i in range(0, len(texts), DEFAULT_BATCH_SIZE)]
    for _ in range(repeats):  # the whole job each time: Ray Data's start-up counts
        started = time.perf_counter()
        if via_data:
            ds = ray.data.from_items([{"id": i, "prompt": t} for i, t in enumerate(texts)])
            rows = generate(ds, app="llm", max_tokens=max_tokens).take_all()
        else:  # the requests the driver's map actor sends, all at once from here
            calls = [handle.generate_batch.remote(chunk, max_tokens=max_tokens, temperature=0.0) for chunk in chunks]
            rows = [row for call in calls for row in call.result()]
        walls.append(time.perf_counter() - started)
        assert len(rows) == len(texts) and not any(r["error"] for r in rows), "rows lost or failed"
    stats = handle.stats.remote().result().get("batcher", {})
    stop_app()
    return {
        "output_tokens": sum(int(r["output_tokens"]) for r in rows),
        "wall_s": statistics.median(walls),
        "mean_in_flight": stats.get("mean_in_flight", stats.get("avg_batch_size", math.nan)),
    }


def app_burst(requests: list[tuple[str, int]], repeats: int, batcher: dict[str, Any] | None) -> list[list[tuple]]:
    """Each repeat's (latency, output tokens) per single-prompt handle call, all sent at once."""
    args = app_args()
    if batcher is not None:
        args["batcher"] = batcher
    handle = start_app(args)

    async def one(text: str, max_tokens: int) -> tuple[float, int]:
        started = time.perf_counter()
        result = await handle.generate.remote(text, max_tokens=max_tokens, temperature=0.0)
        return time.perf_counter() - started, int(result["output_tokens"])

    async def burst() -> list[tuple[float, int]]:
        return list(await asyncio.gather(*(one(text, m) for text, m in requests)))

    try:
        return [asyncio.run(burst()) for _ in range(repeats)]
    finally:
        stop_app()

"""The simulated routing benchmark's fleet: a local multi-node Ray cluster with Serve on it, the app deployed with
each router, and one run of a schedule through it, sampling the tokens each replica holds."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Awaitable, Callable
from typing import Any

from harness.ports import free_port
from harness.replicas import replica_actors

from .workload import WORKLOADS, schedule

REPLICAS = 4
ROUTERS = ("tokens", "serve")
SAMPLE_S = 0.25

ENGINE: dict[str, Any] = {
    "engine": "simulated",
    # A decode step: 10 ms + 0.1 ms a sequence + 0.5 ms per 1,000 context tokens; 64 sequences and 16k tokens of
    # KV cache per replica (the batcher's budget is the cache): about 2,500 tok/s per replica when full.
    "simulated": {
        "step_s": 0.01,
        "step_s_per_seq": 1e-4,
        "step_s_per_token": 5e-7,
        "max_num_seqs": 64,
        "kv_cache_tokens": 16_384,
    },
    "cpus_per_replica": 1.0,
    "max_ongoing_requests": 4_096,
    "autoscaling": {"min_replicas": REPLICAS, "max_replicas": REPLICAS, "target_ongoing_requests": 64},
}


def start_cluster() -> tuple[Any, str]:
    """A local Ray cluster of ``REPLICAS`` nodes (one logical CPU each) with Serve on it; the HTTP base URL."""
    from harness.environment import use_serve_env

    use_serve_env()  # make serve's settings, before ray.serve is imported
    import ray
    from ray import serve
    from ray.cluster_utils import Cluster

    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "include_dashboard": False})
    for _ in range(REPLICAS - 1):
        cluster.add_node(num_cpus=1)
    ray.init(address=cluster.address, log_to_driver=False)
    port = free_port()
    serve.start(proxy_location="HeadOnly", http_options={"host": "127.0.0.1", "port": port})
    return cluster, f"http://127.0.0.1:{port}"


def node_of(actor: Any) -> str:
    from ray._private import state

    return state.actors(actor_id=actor._actor_id.hex())["Address"]["NodeID"]


async def deploy(router: str) -> tuple[Any, dict[str, Any]]:
    """The app with ``router``, its ``REPLICAS`` replicas up and (token router) reporting; (handle, actors)."""
    from ray import serve

    from serve_app.app import build_app

    app = f"route-{router}"
    args = {**ENGINE, "routing": {"router": router}}
    handle = await asyncio.to_thread(serve.run, build_app(args), name=app, route_prefix=f"/{app}")
    actors: dict[str, Any] = {}
    deadline = time.monotonic() + 120
    while len(actors) < REPLICAS:
        assert time.monotonic() < deadline, f"only {len(actors)} replicas of {app}"
        await asyncio.sleep(0.5)
        actors = replica_actors(app)
    reports = await asyncio.gather(*(a.record_routing_stats.remote() for a in actors.values()))
    assert all("token_load" in r for r in reports), reports
    for i in range(2 * REPLICAS):  # warm up every replica and the router's view of them
        await handle.generate.remote(f"warm up {i}", max_tokens=2)
    await asyncio.sleep(3.0)  # two report periods (Serve's control loop runs once a second here)
    return handle, actors


async def per_replica(handle: Any, replicas: int, timeout_s: float = 60.0) -> dict[str, dict[str, Any]]:
    """Each replica's ``stats()`` by replica id (calls land wherever the router sends them, until all answered)."""
    seen: dict[str, dict[str, Any]] = {}
    deadline = time.monotonic() + timeout_s
    while len(seen) < replicas and time.monotonic() < deadline:
        stats = await handle.stats.remote()
        seen[stats["replica"]["replica_id"]] = stats
    return seen


async def sample_loads(actors: dict[str, Any], stop: asyncio.Event, start: float) -> list[tuple[float, list[float]]]:
    """Every ``SAMPLE_S`` until ``stop``: the tokens each replica holds (its own report), by replica id's order, with
    the seconds since ``start``."""
    ids, samples = sorted(actors), []
    while not stop.is_set():
        reports = await asyncio.gather(*(actors[i].record_routing_stats.remote() for i in ids))
        samples.append((time.monotonic() - start, [r["token_load"] for r in reports]))
        await asyncio.sleep(SAMPLE_S)
    return samples


async def in_rounds(
    variants: list[Any], rounds: int, run: Callable[[Any], Awaitable[dict[str, Any]]], shown: tuple[str, ...]
) -> list[dict[str, Any]]:
    """``run`` for every variant in every round (the order reversed in odd rounds) on one fresh cluster; each run's
    figures with its ``round``, the ``shown`` ones printed as it ends."""
    cluster, _ = start_cluster()
    import ray
    from ray import serve

    runs = []
    try:
        for k in range(rounds):
            for variant in variants if k % 2 == 0 else variants[::-1]:
                figures = await run(variant)
                print({key: figures[key] for key in shown}, flush=True)
                runs.append({**figures, "round": k})
    finally:
        serve.shutdown()
        ray.shutdown()
        cluster.shutdown()
    return runs


# -- One run ------------------------------------------------------------------------------------------------


async def run_once(router: str, events: list[dict[str, Any]], base_url: str) -> dict[str, Any]:
    """Deploy, play ``events``, sample the tokens held, delete; everything measured."""
    import aiohttp
    from ray import serve

    handle, actors = await deploy(router)
    app = f"route-{router}"
    before = await per_replica(handle, REPLICAS)
    streams: list[dict[str, Any]] = []
    batches: list[dict[str, Any]] = []
    https: list[dict[str, Any]] = []
    errors: list[str] = []
    stop = asyncio.Event()
    start = time.monotonic()

    async def stream(e: dict[str, Any]) -> None:
        sent, first, result = time.monotonic(), None, None
        try:
            call = handle.options(stream=True).generate_stream.remote(e["prompt"], max_tokens=e["max_tokens"])
            async for item in call:
                first = first or time.monotonic()
                if item["type"] == "result":
                    result = item
            assert result is not None, "no result"
            streams.append(
                {
                    "at": sent - start,
                    "ttft": first - sent,  # type: ignore[operator]
                    "e2e": time.monotonic() - sent,
                    "tokens": result["output_tokens"],
                    "done": time.monotonic() - start,
                }
            )
        except Exception as exc:
            errors.append(f"stream: {exc!r}"[:300])

    async def batch(e: dict[str, Any]) -> None:
        sent = time.monotonic()
        try:
            rows = await handle.generate_batch.remote(e["prompts"], max_tokens=e["max_tokens"])
            errors.extend(f"batch row: {r['error']}" for r in rows if r["error"] is not None)
            tokens = sum(r["output_tokens"] for r in rows if r["error"] is None)
            batches.append({"at": sent - start, "e2e": time.monotonic() - sent, "tokens": tokens, "rows": len(rows)})
            batches[-1]["done"] = time.monotonic() - start
        except Exception as exc:
            errors.append(f"batch: {exc!r}"[:300])

    async def http(e: dict[str, Any], session: aiohttp.ClientSession) -> None:
        body = {"messages": [{"role": "user", "content": e["content"]}], "max_tokens": e["max_tokens"]}
        try:
            async with session.post(f"{base_url}/{app}/v1/chat/completions", json=body) as response:
                answer = await response.json()
            if response.status != 200:
                raise RuntimeError(f"{response.status}: {answer}")
            https.append({"tokens": answer["usage"]["completion_tokens"], "done": time.monotonic() - start})
        except Exception as exc:
            errors.append(f"http: {exc!r}"[:300])

    sampler = asyncio.create_task(sample_loads(actors, stop, start))
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=600)) as session:
        tasks = []
        for e in events:
            await asyncio.sleep(max(0.0, e["at"] - (time.monotonic() - start)))
            work = stream(e) if e["kind"] == "stream" else batch(e) if e["kind"] == "batch" else http(e, session)
            tasks.append(asyncio.create_task(work))
        await asyncio.gather(*tasks)
    ended = time.monotonic() - start
    stop.set()
    samples = await sampler
    after = await per_replica(handle, REPLICAS)
    nodes = {rid: await asyncio.to_thread(node_of, actor) for rid, actor in actors.items()}
    await asyncio.to_thread(serve.delete, app)
    ran = {
        rid: s["engine_stats"]["requests"]
        - before.get(rid, {"engine_stats": {"requests": 0}})["engine_stats"]["requests"]
        for rid, s in after.items()
    }
    return {
        "router": router,
        "streams": streams,
        "batches": batches,
        "https": https,
        "errors": errors,
        "samples": samples,
        "ended_s": ended,
        "nodes": nodes,
        "sent": len(events),
        "answered": len(streams) + len(batches) + len(https),
        "prompts_sent": sum(len(e["prompts"]) if e["kind"] == "batch" else 1 for e in events),
        "prompts_run": sum(ran.values()),
        "prompts_per_replica": ran,
        "replicas_seen": len(after),
    }


async def measure(plan: list[tuple[str, int]], seed: int = 7) -> dict[str, Any]:
    """Each ``(workload, rounds)`` of ``plan`` through both routers on one cluster, alternating which goes first."""
    cluster, base_url = start_cluster()  # first: it sets serve.env's settings before ray.serve is imported
    import ray
    from ray import serve

    scenarios: dict[str, Any] = {}
    try:
        for mode, rounds in plan:
            events = schedule(WORKLOADS[mode], seed)
            runs: dict[str, list[dict[str, Any]]] = {r: [] for r in ROUTERS}
            for k in range(rounds):
                for router in ROUTERS if k % 2 == 0 else ROUTERS[::-1]:
                    run = await run_once(router, events, base_url)
                    runs[router].append(run)
                    brief = {key: run[key] for key in ("router", "answered", "sent", "prompts_run", "prompts_sent")}
                    print(json.dumps({"workload": mode, **brief, "errors": len(run["errors"])}), flush=True)
            scenarios[mode] = {"workload": WORKLOADS[mode], "rounds": rounds, "runs": runs}
    finally:
        serve.shutdown()
        ray.shutdown()
        cluster.shutdown()
    return {"engine": ENGINE, "seed": seed, "scenarios": scenarios}

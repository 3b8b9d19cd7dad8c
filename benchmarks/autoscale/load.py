"""The autoscaling benchmark's apps and loads: the skewed workload against each policy, and the metric pipeline's
reaction after a lull, each watching the app's replica counts."""

from __future__ import annotations

import asyncio
import random
import time
from typing import Any

ENGINE = {
    "simulated": {"step_s": 0.02, "step_s_per_token": 2e-6, "max_num_seqs": 32, "kv_cache_tokens": 8_192},
    "batcher": {"max_inflight": 32, "max_queue_size": 64},  # max_inflight_tokens: auto = the KV cache, 8,192
    "cpus_per_replica": 0.25,
}
SHIPPED = {"metrics_interval_s": 2.0, "look_back_period_s": 10.0, "upscale_delay_s": 5.0}
POLICIES = {
    "requests": {"metric": "requests", "target_ongoing_requests": 64},
    "tokens": {"metric": "tokens"},  # target_tokens: each replica's in-flight budget
}
PIPELINES = {
    "old (10 s reports, 30 s window, 5 s delay)": {
        "metrics_interval_s": 10.0,
        "look_back_period_s": 30.0,
        "upscale_delay_s": 5.0,
    },
    "shipped (2 s reports, 10 s window, 5 s delay)": SHIPPED,
}
LONG_CLIENTS, LONG_PROMPTS, LONG_CHARS, LONG_MAX_TOKENS = 3, 32, 1_000, 32
CHAT_CHARS, CHAT_MAX_TOKENS = 80, 16


def _counts(app: str) -> tuple[int, int]:
    """The app's replicas: RUNNING, and all (STARTING included)."""
    from ray import serve

    status = serve.status().applications.get(app)
    if status is None:
        return 0, 0
    states = [d.replica_states for d in status.deployments.values()]
    return sum(s.get("RUNNING", 0) for s in states), sum(sum(s.values()) for s in states)


async def _poll(app: str, start: float, out: list[tuple[float, int, int]], stop: asyncio.Event) -> None:
    while not stop.is_set():
        running, every = await asyncio.to_thread(_counts, app)
        out.append((round(time.monotonic() - start, 2), running, every))
        await asyncio.sleep(0.5)


def deploy(app: str, autoscaling: dict[str, Any]) -> None:
    from ray import serve

    from serve_app.app import build_app

    args = {"engine": "simulated", **ENGINE, "autoscaling": {"min_replicas": 1, "max_replicas": 2, **autoscaling}}
    serve.run(build_app(args), name=app, route_prefix=f"/{app}")


async def skewed(url: str, app: str, load_s: float, tail_s: float, chat_rate: float, seed: int) -> dict[str, Any]:
    """The skewed workload for ``load_s``; then replicas are watched for up to ``tail_s`` until back to 1."""
    import aiohttp

    rng = random.Random(seed)
    start = time.monotonic()
    stop, stop_poll = asyncio.Event(), asyncio.Event()
    timeline: list[tuple[float, int, int]] = []
    chats: list[dict[str, Any]] = []
    longs: list[dict[str, Any]] = []
    long_body = {"prompts": [f"long {i} " + "x" * LONG_CHARS for i in range(LONG_PROMPTS)]}
    poller = asyncio.create_task(_poll(app, start, timeline, stop_poll))
    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=300)) as session:

        async def long_client(c: int) -> None:
            while not stop.is_set():
                sent, rejected = time.monotonic(), 0
                while True:
                    body = {**long_body, "task_id": f"l{c}", "max_tokens": LONG_MAX_TOKENS}
                    async with session.post(f"{url}/generate", json=body) as response:
                        status, retry = response.status, response.headers.get("Retry-After")
                        await response.read()
                    if status != 503:
                        break
                    rejected += 1
                    await asyncio.sleep(float(retry or 1))
                latency = time.monotonic() - sent
                longs.append({"at": sent - start, "latency": latency, "status": status, "503": rejected})

        async def chat(i: int) -> None:
            sent = time.monotonic()
            body = {
                "messages": [{"role": "user", "content": f"chat {i} " + "y" * CHAT_CHARS}],
                "max_tokens": CHAT_MAX_TOKENS,
            }
            async with session.post(f"{url}/v1/chat/completions", json=body) as response:
                status = response.status
                await response.read()
            chats.append({"at": sent - start, "latency": time.monotonic() - sent, "status": status})

        async def chat_arrivals() -> None:
            tasks, i = [], 0
            while not stop.is_set():
                tasks.append(asyncio.create_task(chat(i)))
                i += 1
                await asyncio.sleep(rng.expovariate(chat_rate))
            await asyncio.gather(*tasks)

        load = asyncio.gather(chat_arrivals(), *(long_client(c) for c in range(LONG_CLIENTS)))
        await asyncio.sleep(load_s)
        stop.set()
        await load
    ended = time.monotonic() - start
    deadline = time.monotonic() + tail_s
    while time.monotonic() < deadline and not (timeline and timeline[-1][1:] == (1, 1) and timeline[-1][0] > ended):
        await asyncio.sleep(0.5)
    stop_poll.set()
    await poller
    return {"timeline": timeline, "chats": chats, "longs": longs, "load_s": load_s, "ended_s": ended}


async def pipeline(url: str, app: str, idle_s: float, timeout_s: float) -> dict[str, float | None]:
    """One request, ``idle_s`` of quiet (the window full of idle reports, as when load rises after a lull),
    then 24 closed-loop clients until a second replica runs: seconds to the decision and to it running."""
    import aiohttp

    stop = asyncio.Event()
    timeline: list[tuple[float, int, int]] = []
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=120)) as session:
        async with session.post(f"{url}/generate", json={"prompts": ["warm up"], "max_tokens": 1}) as r:
            await r.read()
        await asyncio.sleep(idle_s)
        start = time.monotonic()
        poller = asyncio.create_task(_poll(app, start, timeline, stop))

        async def client(c: int) -> None:
            k = 0
            while not stop.is_set():
                async with session.post(f"{url}/generate", json={"prompts": [f"c{c} n{k}"], "max_tokens": 8}) as r:
                    await r.read()
                k += 1

        clients = asyncio.gather(*(client(c) for c in range(24)))
        while time.monotonic() - start < timeout_s and not (timeline and timeline[-1][1] >= 2):
            await asyncio.sleep(0.25)
        stop.set()
        await clients
    await poller
    decision = next((t for t, _, a in timeline if a >= 2), None)
    running = next((t for t, r, _ in timeline if r >= 2), None)
    return {"decision_s": decision, "running_s": running}

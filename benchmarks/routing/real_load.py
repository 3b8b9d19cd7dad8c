"""The real-replica routing benchmark's load: one seeded schedule of streamed chats and batch calls for every peer,
sent through a peer's HTTP proxy, and the figures of its outcomes."""

from __future__ import annotations

import asyncio
import json
import math
import random
import statistics
import time
from collections.abc import AsyncIterator
from typing import Any

from harness.stats import percentile

from ..lib.peers import MODEL_NAME

LOAD_S = {"full": 180.0, "quick": 60.0}
WORKLOADS: dict[str, dict[str, Any]] = {
    # chats a second, their output tokens (log-uniform); calls of `prompts` x `tokens`, from `first_s` every `every_s`
    "chats": {"rate": 0.8, "chat_tokens": (8, 256), "prompts": 16, "tokens": 64, "first_s": 5.0, "every_s": 30.0},
    "batches": {"rate": 0.5, "chat_tokens": (8, 512), "prompts": 256, "tokens": 16, "first_s": 20.0, "every_s": 90.0},
}
PROMPT_WORDS = (8, 60)
WORDS = ("river", "stone", "cloud", "paper", "light", "music", "garden", "window", "morning", "silver", "forest")


def schedule(workload: dict[str, Any], load_s: float, seed: int = 11) -> list[dict[str, Any]]:
    """The seeded load: chats in Poisson arrivals and the workload's batch calls, by send time."""
    rng = random.Random(seed)

    def prompt() -> str:
        return " ".join(rng.choice(WORDS) for _ in range(rng.randint(*PROMPT_WORDS)))

    low, high = workload["chat_tokens"]
    events: list[dict[str, Any]] = []
    at = rng.expovariate(workload["rate"])
    while at < load_s:
        tokens = int(math.exp(rng.uniform(math.log(low), math.log(high))))
        events.append({"at": at, "kind": "chat", "prompt": prompt(), "max_tokens": tokens})
        at += rng.expovariate(workload["rate"])
    at = workload["first_s"]
    while at < load_s:
        prompts = [prompt() for _ in range(workload["prompts"])]
        events.append({"at": at, "kind": "batch", "prompt": prompts, "max_tokens": workload["tokens"]})
        at += workload["every_s"]
    return sorted(events, key=lambda e: e["at"])


async def sse_chunks(response: Any) -> AsyncIterator[dict[str, Any]]:
    """The JSON chunks of a streamed OpenAI answer (aiohttp's response), up to ``[DONE]``; an error chunk raises."""
    async for raw in response.content:
        line = raw.decode().strip()
        if line.startswith("data: ") and line != "data: [DONE]":
            chunk = json.loads(line.removeprefix("data: "))
            if "error" in chunk:
                raise RuntimeError(str(chunk["error"])[:200])
            yield chunk


async def send(session: Any, url: str, event: dict[str, Any], start: float) -> dict[str, Any]:
    """One request at its time: a chat streams (its TTFT is its first text), a batch call does not."""
    await asyncio.sleep(max(0.0, start + event["at"] - time.perf_counter()))
    stream = event["kind"] == "chat"
    body = {"model": MODEL_NAME, "prompt": event["prompt"], "max_tokens": event["max_tokens"], "temperature": 0.0}
    body |= {"ignore_eos": True, "stream": stream} | ({"stream_options": {"include_usage": True}} if stream else {})
    sent = time.perf_counter()
    out: dict[str, Any] = {"kind": event["kind"], "sent": sent - start, "ok": False, "tokens": 0, "ttft": None}
    try:
        async with session.post(f"{url}/v1/completions", json=body) as response:
            if response.status != 200:
                out["error"] = f"{response.status}: {(await response.text())[:200]}"
                return out
            if not stream:
                out["tokens"] = (await response.json())["usage"]["completion_tokens"]
            else:
                async for chunk in sse_chunks(response):
                    if chunk.get("usage"):
                        out["tokens"] = chunk["usage"]["completion_tokens"]
                    if out["ttft"] is None and any(c.get("text") for c in chunk.get("choices", [])):
                        out["ttft"] = time.perf_counter() - sent
    except Exception as exc:  # a dropped connection is a failed request, counted as such
        out["error"] = repr(exc)[:200]
        return out
    out |= {"ok": True, "e2e": time.perf_counter() - sent, "done": time.perf_counter() - start}
    return out


async def load(url: str, events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    import aiohttp

    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=900)) as session:
        start = time.perf_counter()
        return list(await asyncio.gather(*(send(session, url, e, start) for e in events)))


REQUEST_FIELDS = ("kind", "ok", "sent", "ttft", "e2e", "done", "tokens")
"""What the JSON keeps of each request (seconds from the load's start, or from the request's own send)."""


def summarize(outcomes: list[dict[str, Any]]) -> dict[str, Any]:
    ok = [o for o in outcomes if o["ok"]]
    chats = [o for o in ok if o["kind"] == "chat"]
    batches = [o for o in ok if o["kind"] == "batch"]
    span = max((o["done"] for o in ok), default=math.nan) - min(o["sent"] for o in outcomes)
    return {
        "sent": len(outcomes),
        "failed": len(outcomes) - len(ok),
        "errors": sorted({o["error"] for o in outcomes if not o["ok"]})[:3],
        "output_tok_s": sum(o["tokens"] for o in ok) / span,
        "ttft_p50_s": statistics.median(o["ttft"] for o in chats if o["ttft"] is not None),
        "ttft_p99_s": percentile([o["ttft"] for o in chats if o["ttft"] is not None], 99),
        "e2e_p99_s": percentile([o["e2e"] for o in chats], 99),
        "batch_mean_s": statistics.mean(o["e2e"] for o in batches) if batches else math.nan,
    }

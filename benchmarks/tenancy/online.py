"""The tenancy benchmark's online load: streamed chats at priority 0 in Poisson arrivals, and their TTFTs alone,
beside the job and while it streams."""

from __future__ import annotations

import asyncio
import json
import math
import random
import statistics
import time
from typing import Any

from harness.stats import percentile

from ..lib.peers import MODEL_NAME

ONLINE_SHARE = 0.3
ONLINE_TOKENS = 32
ONLINE_QUESTIONS = [
    "What is the capital of France?",
    "Name three colours of the rainbow.",
    "Give me a short greeting.",
    "What is two plus two?",
    "Tell me one fact about the sea.",
]


async def one_chat(session: Any, url: str, question: str, sent: float) -> dict[str, Any]:
    """One streamed chat request at priority 0: its time to first token and to the end, and its tokens."""
    body = {
        "model": MODEL_NAME,
        "messages": [{"role": "user", "content": question}],
        "max_tokens": ONLINE_TOKENS,
        "temperature": 0.0,
        "ignore_eos": True,
        "stream": True,
        "stream_options": {"include_usage": True},
        "priority": 0,
    }
    first = None
    tokens = 0
    try:
        async with session.post(f"{url}/v1/chat/completions", json=body) as response:
            if response.status != 200:
                return {"ok": False, "status": response.status}
            async for raw in response.content:
                line = raw.decode().strip()
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                chunk = json.loads(line[len("data: ") :])
                if "error" in chunk:
                    return {"ok": False, "status": chunk["error"].get("code")}
                if chunk.get("usage"):
                    tokens = chunk["usage"]["completion_tokens"]
                if first is None and any((c.get("delta") or {}).get("content") for c in chunk.get("choices", [])):
                    first = time.perf_counter() - sent
    except Exception as exc:  # a dropped connection is a failed request, counted as such
        return {"ok": False, "status": repr(exc)}
    return {"ok": first is not None, "ttft": first, "e2e": time.perf_counter() - sent, "tokens": tokens, "sent": sent}


async def online_load(url: str, rate: float, until: Any, seed: int = 0) -> list[dict[str, Any]]:
    """Poisson arrivals at ``rate`` per second until ``until()`` says stop; every request's outcome."""
    import aiohttp

    rng = random.Random(seed)
    tasks = []
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=600)) as session:
        while not until():
            sent = time.perf_counter()
            tasks.append(asyncio.ensure_future(one_chat(session, url, rng.choice(ONLINE_QUESTIONS), sent)))
            await asyncio.sleep(rng.expovariate(rate))
        return list(await asyncio.gather(*tasks))


def online_row(outcomes: list[dict[str, Any]], wall: float) -> dict[str, Any]:
    ok = [o for o in outcomes if o["ok"]]
    ttfts = [o["ttft"] for o in ok]
    return {
        "online_requests": len(outcomes),
        "online_failed": len(outcomes) - len(ok),
        "online_tok_s": sum(o["tokens"] for o in ok) / wall if wall else math.nan,
        "ttft_p50_s": statistics.median(ttfts) if ttfts else math.nan,
        "ttft_p99_s": percentile(ttfts, 99),
    }


def window_ttfts(outcomes: list[dict[str, Any]], started: float, begins: float, ends: float) -> dict[str, Any]:
    """TTFT p50/p99 of the chats sent while the job streams (``begins`` to ``ends`` s after ``started``: the
    job saturating the replica) and p99 of those sent before it (a Ray Data driver starting on the same cores)."""
    streaming = [o["ttft"] for o in outcomes if o["ok"] and begins <= o["sent"] - started <= ends]
    starting = [o["ttft"] for o in outcomes if o["ok"] and o["sent"] - started < begins]
    return {
        "streaming_ttft_p50_s": statistics.median(streaming) if streaming else math.nan,
        "streaming_ttft_p99_s": percentile(streaming, 99),
        "starting_requests": len(starting),
        "starting_ttft_p99_s": percentile(starting, 99),
    }

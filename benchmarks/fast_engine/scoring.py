"""The short-request load: an evaluation harness scoring choices, as lm-evaluation-harness's ``local-completions``
model does (``/v1/completions``, ``max_tokens`` 1 with ``echo`` and ``logprobs``, greedy, a few requests at a time),
so the time between a request's arrival and its answer is the serving path's and the engine's one short step."""

from __future__ import annotations

import asyncio
import random
import time
from pathlib import Path
from typing import Any

from harness.stats import percentile

from ..lib.peers import MODEL_NAME

REQUESTS, CONCURRENCY = 200, 8
PROMPT_TOKENS = (20, 60)
"""Each prompt's length in tokens, drawn uniformly: a question with one answer choice appended."""


def prompts(folder: Path, count: int = REQUESTS, seed: int = 0) -> list[str]:
    """``count`` texts of :data:`PROMPT_TOKENS` tokens each, decoded from seeded random ids of the model's
    vocabulary (its special tokens left out)."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(folder))
    special = set(tokenizer.all_special_ids)
    ids = [i for i in range(min(tokenizer.vocab_size, 32000)) if i not in special]
    rng = random.Random(seed)
    return [tokenizer.decode(rng.sample(ids, rng.randint(*PROMPT_TOKENS))) for _ in range(count)]


def body(prompt: str) -> dict[str, Any]:
    """One scoring request: the prompt's own log probabilities (``echo``) and one greedy token."""
    return {"model": MODEL_NAME, "prompt": prompt, "max_tokens": 1, "echo": True, "logprobs": 1, "temperature": 0}


async def _run(url: str, texts: list[str], concurrency: int) -> dict[str, Any]:
    import aiohttp

    latencies: list[float] = []
    errors: list[str] = []
    queue: asyncio.Queue[str] = asyncio.Queue()
    for text in texts:
        queue.put_nowait(text)

    async def worker(session: aiohttp.ClientSession) -> None:
        while not queue.empty():
            text = queue.get_nowait()
            sent = time.perf_counter()
            try:
                async with session.post(f"{url}/v1/completions", json=body(text)) as response:
                    answer = await response.json(content_type=None)
                    if response.status != 200 or not answer["choices"][0]["logprobs"]["token_logprobs"]:
                        errors.append(f"{response.status}: {str(answer)[:200]}")
                        continue
            except (aiohttp.ClientError, asyncio.TimeoutError, KeyError) as exc:
                errors.append(f"{type(exc).__name__}: {exc}")
                continue
            latencies.append(time.perf_counter() - sent)

    timeout = aiohttp.ClientTimeout(total=120)
    async with aiohttp.ClientSession(timeout=timeout, connector=aiohttp.TCPConnector(limit=concurrency)) as session:
        started = time.perf_counter()
        await asyncio.gather(*(worker(session) for _ in range(concurrency)))
        wall = time.perf_counter() - started
    return {"wall_s": wall, "latencies": latencies, "errors": errors}


def score(url: str, texts: list[str], concurrency: int = CONCURRENCY) -> dict[str, Any]:
    """Send every text once, ``concurrency`` at a time (a warm-up of ``concurrency`` first, not counted); the wall
    time, completed and failed requests, and request latency p50/p99 in ms."""
    asyncio.run(_run(url, texts[:concurrency], concurrency))
    out = asyncio.run(_run(url, texts, concurrency))
    latencies = out["latencies"]
    return {
        "wall_s": out["wall_s"],
        "completed": len(latencies),
        "failed": len(out["errors"]),
        "errors": out["errors"][:3],
        "request_p50_ms": 1000 * percentile(latencies, 50),
        "request_p99_ms": 1000 * percentile(latencies, 99),
    }

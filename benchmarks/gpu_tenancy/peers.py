"""The GPU tenancy benchmark's peers: the batcher or the engine alone in front of transformers' engine, each through
the job alone, the chats alone, then both."""

from __future__ import annotations

import argparse
import asyncio
import math
import random
import statistics
import time
from typing import Any

from batching import ContinuousBatcher
from harness.stats import percentile

from ..lib.report import after, timeline
from .hf_engine import Engine, Request

ONLINE_SHARE = 0.3
CHAT_PROMPT, CHAT_TOKENS = 32, 32
JOB_PROMPT, JOB_TOKENS = 128, 64
JOB_PRIORITY = 1
PEERS = (
    "admission-engine-priority",
    "admission-engine-priority-no-share",
    "engine-priority",
    "admission",
    "engine",
    "admission-no-priorities",
    "admission-step-cap",
    "admission-engine-priority-step-cap",
)


async def run_one(peer: Any, request: Request) -> dict[str, Any]:
    """One request through ``peer`` (a batcher or the engine): its TTFT, E2E and tokens."""
    sent = time.perf_counter()
    first, tokens = None, 0
    source = await peer.stream(request) if isinstance(peer, ContinuousBatcher) else peer.stream(request)
    async for tokens in source:
        if first is None and tokens:
            first = time.perf_counter() - sent
    return {"ttft": first, "e2e": time.perf_counter() - sent, "tokens": tokens, "sent": sent}


def prompt(rng: random.Random, length: int, vocab: int) -> list[int]:
    return [rng.randrange(1, vocab) for _ in range(length)]


async def job(peer: Any, rows: int, priority: int, vocab: int, stream: bool = False) -> dict[str, Any]:
    """``rows`` prompts, all submitted at once; the job's output tokens and wall time."""
    rng = random.Random(7)
    requests = [Request(prompt(rng, JOB_PROMPT, vocab), JOB_TOKENS, priority, stream) for _ in range(rows)]
    began = time.perf_counter()
    outcomes = await asyncio.gather(*(run_one(peer, r) for r in requests))
    wall = time.perf_counter() - began
    return {"tokens": sum(o["tokens"] for o in outcomes), "wall_s": wall, "ended_at": time.perf_counter()}


async def chats(peer: Any, rate: float, until: Any, vocab: int, seed: int) -> tuple[list[dict[str, Any]], float]:
    """Streamed chats at priority 0, Poisson arrivals at ``rate``/s until ``until()``; outcomes, when it began."""
    rng = random.Random(seed)
    tasks = []
    began = time.perf_counter()
    while not until():
        request = Request(prompt(rng, CHAT_PROMPT, vocab), CHAT_TOKENS, 0, stream=True)
        tasks.append(asyncio.ensure_future(run_one(peer, request)))
        await asyncio.sleep(rng.expovariate(rate))
    outcomes = list(await asyncio.gather(*tasks))
    return outcomes, began


def chat_row(outcomes: list[dict[str, Any]], began: float, wall: float) -> dict[str, Any]:
    """TTFT p50/p99, tok/s, and each chat's [seconds into the phase when sent, TTFT]: where the tail falls."""
    ttfts = [o["ttft"] for o in outcomes if o["ttft"] is not None]
    return {
        "chats": len(outcomes),
        "chat_tok_s": sum(o["tokens"] for o in outcomes) / wall,
        "ttft_p50_s": statistics.median(ttfts),
        "ttft_p99_s": percentile(ttfts, 99),
        "timeline": timeline(outcomes, began),
    }


async def measure(name: str, engine: Engine, args: argparse.Namespace, rate: float | None, vocab: int) -> dict:
    """One peer's three phases on ``engine``; ``rate`` None: 30% of this peer's job-alone tok/s."""
    row: dict[str, Any] = {"peer": name}
    priority = 0 if name == "admission-no-priorities" else JOB_PRIORITY
    capped = name.endswith("step-cap")
    batcher = None
    engine.priorities_on = "engine-priority" in name
    if name.startswith("admission"):  # the replica's defaults (serve_app.config.batcher.ContinuousSettings)
        batcher = ContinuousBatcher(
            engine.stream,
            max_inflight_cost=args.kv_tokens,
            max_inflight=args.max_seqs,
            max_queue_size=args.rows + 100_000,
            low_priority_share=1.0 if name.endswith("no-share") else 0.5,
            share_hold_s=5.0,
            aging_s=30.0,
            low_priority_step_budget=args.step_tokens // 2 if capped else None,
            growth_estimator=lambda request: request.max_new_tokens,
        )
        await batcher.start()
    peer = batcher or engine
    try:
        alone = await job(peer, args.rows, priority, vocab, capped)
        row["job_alone_tok_s"] = alone["tokens"] / alone["wall_s"]
        rate = rate or ONLINE_SHARE * row["job_alone_tok_s"] / CHAT_TOKENS
        row["chat_rate"] = rate
        outcomes, began = await chats(peer, rate, after(args.online_s), vocab, seed=1)
        row |= {f"alone_{k}": v for k, v in chat_row(outcomes, began, time.perf_counter() - began).items()}
        running = asyncio.ensure_future(job(peer, args.rows, priority, vocab, capped))
        outcomes, began = await chats(peer, rate, running.done, vocab, seed=2)
        beside = await running
        row |= {f"beside_{k}": v for k, v in chat_row(outcomes, began, time.perf_counter() - began).items()}
        row["job_beside_tok_s"] = beside["tokens"] / beside["wall_s"]
    finally:
        if batcher is not None:
            await batcher.stop()
    left = row["job_alone_tok_s"] - row["alone_chat_tok_s"]
    row["ttft_p99_vs_alone"] = row["beside_ttft_p99_s"] / row["alone_ttft_p99_s"]
    row["ttft_p50_vs_alone"] = row["beside_ttft_p50_s"] / row["alone_ttft_p50_s"]
    row["job_vs_left"] = row["job_beside_tok_s"] / left if left > 0 else math.nan
    return row

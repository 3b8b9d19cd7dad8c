"""The simulated routing benchmark's workloads: seeded schedules of streamed requests, batch calls and HTTP chats,
the same for every router."""

from __future__ import annotations

import math
import random
from typing import Any

WORKLOADS: dict[str, dict[str, Any]] = {
    # seconds of arrivals, interactive requests/s, batch calls (at these seconds) of `prompts` x `max_tokens`
    "full": {"load_s": 60.0, "rate": 6.0, "batch_at": [5.0, 20.0, 35.0, 50.0], "prompts": 256, "batch_max": 128},
    "quick": {"load_s": 30.0, "rate": 6.0, "batch_at": [4.0, 16.0], "prompts": 256, "batch_max": 128},
    "check": {
        "load_s": 20.0,
        "rate": 8.0,
        "batch_at": [1.0 * i for i in range(20)],
        "prompts": 48,
        "batch_max": [256, 32],  # two jobs' batches: long answers, short ones
        "http_chats": 12,
        "max_output": 64,
    },
}


def schedule(workload: dict[str, Any], seed: int) -> list[dict[str, Any]]:
    """The requests (``at`` seconds after the start), the same for every router."""
    rng = random.Random(seed)
    events: list[dict[str, Any]] = []
    t, i = rng.expovariate(workload["rate"]), 0
    top = workload.get("max_output", 1_024)
    while t < workload["load_s"]:
        prompt = f"user {i} asks " + "about tokens " * rng.randint(6, 120)  # 20-400 tokens
        tokens = int(math.exp(rng.uniform(math.log(8), math.log(top + 1))))  # log-uniform 8..top
        events.append({"at": t, "kind": "stream", "prompt": prompt, "max_tokens": min(tokens, top)})
        t, i = t + rng.expovariate(workload["rate"]), i + 1
    lengths = workload["batch_max"] if isinstance(workload["batch_max"], list) else [workload["batch_max"]]
    for b, at in enumerate(workload["batch_at"]):
        prompts = [f"batch {b} row {j} " + "summarize this " * 12 for j in range(workload["prompts"])]
        events.append({"at": at, "kind": "batch", "prompts": prompts, "max_tokens": lengths[b % len(lengths)]})
    for h in range(workload.get("http_chats", 0)):
        at = workload["load_s"] * (h + 0.5) / workload["http_chats"]
        events.append({"at": at, "kind": "http", "content": f"http chat {h} " + "hello " * 20, "max_tokens": 16})
    return sorted(events, key=lambda e: e["at"])

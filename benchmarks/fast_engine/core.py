"""The generation core without Ray Serve or HTTP, against vLLM's engine driven directly, on the tiny model: what each
spends per token in the serving process before the response's writes, so the app's own share of the serving
layer's cost is a number apart from Serve's, HAProxy's and Ray's. One engine (serve_config.yaml's settings, the
model swapped), the same streamed completions (128-token prompts, exactly 256 output tokens, greedy) in alternating
phases:

- ``direct``: ``AsyncLLM.generate``'s delta stream, each output made into vLLM's own stream chunk
  (``CompletionStreamResponse`` as JSON, what vLLM's server builds for each);
- ``core``: the app's path, ``Generator.run`` (request building, the admission batcher, the stream merge) and each
  output made into its completions chunks as Server-Sent Events (``sse_events``, the loop of a replica's streamed
  answer).

Each phase collects garbage as its server would: ``core`` with a replica's young-generation threshold, ``direct`` with
Python's default, as vLLM's server keeps it. Prints output tok/s and this process's CPU seconds per 1,000 output
tokens (the engine's own processes, which run the model, not counted); the first phase is a warm-up.

    python -m benchmarks.fast_engine.core [--requests 512] [--concurrency 256] [--rounds 2]
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import os
import random
import tempfile
import time
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from .model import make_tiny_model
from .runs import INPUT_LEN, OUTPUT_LEN

Phase = Callable[[list[int]], Awaitable[tuple[int, int]]]
"""One streamed completion of a prompt's token ids; returns its output tokens and the bytes of its chunks."""


def cpu_seconds() -> float:
    """This process's CPU time, every thread of it."""
    times = os.times()
    return times.user + times.system


async def phase(
    name: str, one: Phase, prompts: list[list[int]], concurrency: int, young_threshold: int
) -> dict[str, Any]:
    """Every prompt through ``one``, at most ``concurrency`` at once, the collector's young generation collected every
    ``young_threshold`` net allocations: tokens, tok/s and CPU-s per 1,000 tokens."""
    slots = asyncio.Semaphore(concurrency)
    gc.set_threshold(young_threshold, *gc.get_threshold()[1:])

    async def limited(prompt: list[int]) -> tuple[int, int]:
        async with slots:
            return await one(prompt)

    cpu, started = cpu_seconds(), time.perf_counter()
    done = await asyncio.gather(*(limited(p) for p in prompts))
    wall, cpu = time.perf_counter() - started, cpu_seconds() - cpu
    tokens, sent = sum(t for t, _ in done), sum(b for _, b in done)
    row = {"phase": name, "tokens": tokens, "tok_s": tokens / wall, "cpu_per_1k": cpu / tokens * 1000}
    print(
        f"{name:7s} {tokens} tokens ({sent / tokens:.0f} bytes of chunks each)  {row['tok_s']:7.0f} tok/s  "
        f"{row['cpu_per_1k']:.4f} CPU-s per 1,000",
        flush=True,
    )
    return row


async def measure(requests: int, concurrency: int, rounds: int, folder: Path) -> list[dict[str, Any]]:
    """``rounds`` of ``direct`` and ``core`` (alternating which goes first) after a warm-up; one row a phase."""
    from vllm import SamplingParams
    from vllm.entrypoints.openai.completion.protocol import CompletionResponseStreamChoice, CompletionStreamResponse
    from vllm.sampling_params import RequestOutputKind

    from serve_app.config import AppConfig
    from serve_app.core.events import sse_events
    from serve_app.core.generator import Generator
    from serve_app.openai.completions import CompletionFormat, CompletionRequest
    from serve_app.serving.replica import YOUNG_COLLECTION_THRESHOLD

    from ..e2e.settings import app_args

    config = AppConfig.model_validate({**app_args(), "model": str(folder)})
    core = Generator(config)
    await core.start()
    rng = random.Random(0)
    prompts = [[rng.randrange(1000, 30000) for _ in range(INPUT_LEN)] for _ in range(requests)]

    async def direct(prompt: list[int]) -> tuple[int, int]:
        params = SamplingParams(
            max_tokens=OUTPUT_LEN, ignore_eos=True, temperature=0.0, output_kind=RequestOutputKind.DELTA
        )
        request_id, tokens, sent = f"cmpl-{uuid.uuid4().hex}", 0, 0
        engine = core.engine._llm  # the core's own AsyncLLM
        async for output in engine.generate({"prompt_token_ids": prompt}, params, request_id):
            out = output.outputs[0]
            tokens += len(out.token_ids)
            choice = CompletionResponseStreamChoice(
                index=0, text=out.text, logprobs=None, finish_reason=out.finish_reason, stop_reason=out.stop_reason
            )
            chunk = CompletionStreamResponse(id=request_id, created=0, model=config.model_name, choices=[choice])
            sent += len(f"data: {chunk.model_dump_json(exclude_unset=False)}\n\n".encode())
        return tokens, sent

    async def app(prompt: list[int]) -> tuple[int, int]:
        body = CompletionRequest.model_validate(
            {"model": config.model_name, "prompt": prompt, "max_tokens": OUTPUT_LEN, "ignore_eos": True, "stream": True}
        )
        requests = await core.requests.completion(body)
        results: list[Any] = [None]
        sent = 0
        async for event in sse_events(core.run(requests), requests, CompletionFormat(config.model_name), results):
            sent += len(event.encode())
        return results[0].output_tokens, sent

    default = gc.get_threshold()[0]
    paths = {"direct": (direct, default), "core": (app, YOUNG_COLLECTION_THRESHOLD)}
    rows = []
    try:
        await phase("warm-up", direct, prompts[:concurrency], concurrency, default)
        for round_ in range(rounds):
            order = ("direct", "core") if round_ % 2 == 0 else ("core", "direct")
            for name in order:
                one, threshold = paths[name]
                rows.append({**await phase(name, one, prompts, concurrency, threshold), "round": round_})
    finally:
        await core.stop()
    for name in ("direct", "core"):
        figures = sorted(r["cpu_per_1k"] for r in rows if r["phase"] == name)
        print(f"{name}: CPU-s per 1,000 tokens {', '.join(f'{f:.4f}' for f in figures)}")
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=512)
    parser.add_argument("--concurrency", type=int, default=256)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="tiny-model-") as tmp:
        folder = make_tiny_model(Path(tmp) / "model")
        asyncio.run(measure(args.requests, args.concurrency, args.rounds, folder))


if __name__ == "__main__":
    main()

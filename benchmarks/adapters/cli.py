"""The engine's cost of LoRA on this machine: the bundled model on vLLM's engine (the app's generation core, in this
process), first without LoRA, then with the bundled adapter enabled (``lora``), serving the base model and the
adapter: LoRA on the modules the adapter targets (``target_modules: auto``, the app's default) and on every module
vLLM can (``all``, vLLM's default). Each load: ``--requests`` chats at once, ``--max-tokens`` tokens each
(``ignore_eos``), after a warm-up; output tok/s and its ratio to the engine without LoRA, per round (engines started
afresh), medians over rounds.

    python -m benchmarks.adapters [--rounds 1] [--requests 16] [--max-tokens 64]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
from typing import Any

from ..lib.report import RESULTS, stamp, table

TARGETS = {"auto": "lora on", "all": "lora on every module"}
PEERS = ("no lora", *(f"{label}, {requests}" for label in TARGETS.values() for requests in ("base model", "adapter")))
COLUMNS = [
    ("peer", "engine and requests", ""),
    ("rounds", "rounds", ""),
    ("tok_s", "output tok/s", ",.0f"),
    ("vs_base", "x no lora", ".2f"),
]


async def _load(core: Any, model: str | None, requests: int, max_tokens: int, seed: int) -> float:
    """Output tok/s of ``requests`` chats at once, each ``max_tokens`` tokens."""
    from serve_app.adapters import questions
    from serve_app.openai.chat import ChatCompletionRequest

    built = []
    for question in questions(requests, seed=seed):
        body = ChatCompletionRequest(
            model=model, messages=[{"role": "user", "content": question}], max_tokens=max_tokens, ignore_eos=True
        )
        built += await core.requests.chat_completion(body)
    started = time.perf_counter()
    results = await core.complete(built)
    return sum(r.output_tokens for r in results) / (time.perf_counter() - started)


async def _round(targets: str | None, requests: int, max_tokens: int) -> dict[str, float]:
    """One engine's loads: without LoRA (``targets`` None) the base model; with it, LoRA on ``targets``, the base
    model and then the bundled adapter."""
    from serve_app.adapters import BUNDLED_ADAPTER
    from serve_app.config import AppConfig
    from serve_app.core import Generator

    lora = {"adapters": {BUNDLED_ADAPTER: "bundled"}, "max_rank": 8, "target_modules": targets}
    core = Generator(AppConfig(vllm={"cpu_replica_niceness": 0}, **({"lora": lora} if targets else {})))
    await core.start()
    try:
        await _load(core, None, 4, 8, seed=99)  # warm-up
        if targets is None:
            return {PEERS[0]: await _load(core, None, requests, max_tokens, seed=1)}
        return {
            f"{TARGETS[targets]}, base model": await _load(core, None, requests, max_tokens, seed=1),
            f"{TARGETS[targets]}, adapter": await _load(core, BUNDLED_ADAPTER, requests, max_tokens, seed=1),
        }
    finally:
        await core.stop()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.adapters", description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--requests", type=int, default=16)
    parser.add_argument("--max-tokens", type=int, default=64)
    args = parser.parse_args(argv)
    started = time.time()
    figures: dict[str, list[float]] = {peer: [] for peer in PEERS}
    ratios: dict[str, list[float]] = {peer: [] for peer in PEERS}
    for _ in range(args.rounds):
        measured = asyncio.run(_round(None, args.requests, args.max_tokens))
        for targets in TARGETS:
            measured |= asyncio.run(_round(targets, args.requests, args.max_tokens))
        for peer, tok_s in measured.items():
            figures[peer].append(tok_s)
            ratios[peer].append(tok_s / measured[PEERS[0]])
    rows = [
        {
            "peer": p,
            "rounds": args.rounds,
            "tok_s": statistics.median(figures[p]),
            "vs_base": statistics.median(ratios[p]),
        }
        for p in PEERS
    ]
    page = (
        "### The engine's cost of LoRA (the bundled model, vLLM's engine in process)\n\n"
        f"{args.requests} chats at once, {args.max_tokens} output tokens each (`ignore_eos`), greedy; each engine "
        "started afresh in each round; `lora on`: LoRA on the modules the adapter targets (`target_modules: auto`, the "
        "app's default), `lora on every module`: on every one vLLM can (`all`, vLLM's default); `x no lora`: the "
        "median of the per-round ratios to the engine without LoRA.\n\n"
        f"{table(rows, COLUMNS)}\n\n{stamp((time.time() - started) / 60)}\n"
    )
    (RESULTS / "adapters.md").write_text(page)
    print(page)
    return 0

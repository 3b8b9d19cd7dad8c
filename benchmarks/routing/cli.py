"""The token-load router against Serve's default router, side by side, on a skewed workload over 4 replicas on
a local 4-node Ray cluster (part (a) of the token-aware fleet; part (b), real vLLM replicas, is elsewhere).

**Fleet**: 4 replicas of the SIMULATED engine, one per node (head + 3 workers of ``ray.cluster_utils.Cluster``,
one logical CPU each, ``cpus_per_replica: 1``), with a cost model where tokens matter: a decode step takes
``step_s + step_s_per_seq x sequences + step_s_per_token x context tokens``, at most ``max_num_seqs`` run, and
the batcher admits up to the KV cache (``kv_cache_tokens``), FIFO; the rest waits in its queue. Ray Serve runs
with ``serve.env`` (as ``make serve``); one HTTP proxy, on the head. Apps differ only in ``routing.router``:
``tokens`` (serve_app/serving/routing/router.py) or ``serve`` (Serve's power of two choices on ongoing requests).

**Workloads** (the same seeded schedule for both routers, open loop, through ``DeploymentHandle`` calls from
this process, whose router is the one under test): interactive requests arrive as a Poisson process, each a
streamed ``generate_stream`` (``handle.options(stream=True)``: the first delta gives the TTFT) with a prompt of
20-400 tokens and an output length drawn log-uniformly (density ~ 1/x: most are short, a few very long); beside
them ``generate_batch`` calls (what one ``/generate`` request of many prompts, or a Ray Data batch, is to Serve:
one ongoing request) at fixed times.

- ``full`` / ``quick``: outputs of 8-1024 tokens at 6/s, and a few batches of 256 prompts x 128 tokens (about
  45k tokens each, three times a replica's KV cache) over 60 s (``quick``: 30 s, one round).
- ``check``: short chats (8-64 tokens) at 8/s, a 48-prompt batch every second for 20 s, alternately with 256- and
  32-token answers (two jobs), and 12 HTTP chats through the proxy (its router prices them by their body's length).
  It is also tests/test_routing.py's multi-node scenario (``--check``: prints ``RESULT {json}``, writes nothing).

Output tok/s: all output tokens / (last answer - first request). The spread: max - min of the tokens each replica
holds (its own report, ``record_routing_stats``, read from every replica every 0.25 s) while the load runs. Rounds
alternate the order (tokens, serve, serve, tokens); percentiles pool the rounds.

    python -m benchmarks.routing [--quick]   # benchmarks/results/routing[-quick].{md,json,png}
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from typing import Any

from ..lib.report import RESULTS, write_section
from .cluster import ROUTERS, measure
from .page import markdown, plot, rounded, summarize


def check() -> dict[str, Any]:
    """The test's scenario: per router, whether every request was answered once, where replicas ran, the spread."""
    result = asyncio.run(measure([("check", 1)]))
    out = {}
    for router, (run,) in result["scenarios"]["check"]["runs"].items():
        s = summarize([run])
        out[router] = {
            **{
                k: run[k]
                for k in ("sent", "answered", "prompts_sent", "prompts_run", "replicas_seen", "nodes", "errors")
            },
            "samples": len(run["samples"]),
            **{k: s[k] for k in ("spread_mean", "spread_p90", "ttft_p99_s", "output_tok_s")},
        }
    return out


def run(quick: bool) -> str:
    plan = [("quick", 1)] if quick else [("full", 2), ("check", 2)]
    result = asyncio.run(measure(plan))
    for scenario in result["scenarios"].values():
        scenario["summary"] = [summarize(scenario["runs"][r]) for r in ROUTERS]
    suffix = "-quick" if quick else ""
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / f"routing{suffix}.json").write_text(json.dumps(rounded(result), default=str))
    try:
        plot(result, RESULTS / f"routing{suffix}.png")
    except ImportError as exc:  # matplotlib is in the bench extra only
        print(f"no plot: {exc}", file=sys.stderr)
    return markdown(result, f"routing{suffix}.png")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.routing", description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="one round of 30 s per router (a few minutes)")
    parser.add_argument("--check", action="store_true", help="tests/test_routing.py's scenario: prints RESULT json")
    args = parser.parse_args(argv)
    if args.check:
        print("RESULT " + json.dumps(check()), flush=True)
        return 0
    print(write_section("routing", args.quick, run))
    return 0


if __name__ == "__main__":
    sys.exit(main())

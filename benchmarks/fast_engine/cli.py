"""The serving path's own cost at GPU token rates, side by side with vLLM's own server.

A tiny random-weight Llama (``benchmarks.fast_engine.model``: the bundled model's tokenizer and config with a few
dimensions shrunk, seeded, made at run time) makes vLLM's CPU engine step in milliseconds, so the engine emits
thousands of tokens a second, as a GPU does with a real model, and what the serving layer adds to every token
decides what users see. Peers, each started afresh on it in every round (order alternating), one at a time:

  app             ``serve run serve_config.yaml`` as shipped, one replica, the model swapped for the tiny one
  vllm            vLLM's OpenAI server as shipped (its CPU build keeps one core for its scheduler)
  vllm-all-cores  the same on every core (``VLLM_CPU_NUM_OF_RESERVED_CPU=0``), which a GPU user's server has
  app-paced       (when named) the app with each stream sending at most one chunk per 30 ms
  app-one-core    (when named) the app with its engine on one core and the other kept, as vLLM's CPU build ships
  app-as-vllm     (when named) the same with vLLM's own step size: the app's engine set as vLLM's server sets its own

``vllm bench serve`` streams random prompts (input 128 tokens, output exactly ``--output-len``, ``ignore_eos``) to
``/v1/completions`` and ``/v1/chat/completions`` at each concurrency (``--max-concurrency``; twice as many
requests). Reported: output tok/s, TTFT and inter-token latency (ITL) p50/p99, and the CPU seconds each process of
each peer spent per 1,000 output tokens (``benchmarks.fast_engine.cpu``): the engine, and the serving layer (all
the rest: the app's replica, proxy and Ray; vLLM's API server). Ratios are to vllm, taken within each round, and
their medians over the rounds.

And a short-request load (``benchmarks.fast_engine.scoring``): an evaluation harness scoring choices, 200
completions of 20-60 tokens with ``max_tokens`` 1, ``echo`` and ``logprobs``, 8 at a time; its wall time, request
latency and the serving layer's CPU per request.

    python -m benchmarks.fast_engine [--quick] [--rounds 2] [--concurrency 64 256 1024] [--output-len 256]
                                     [--peers app vllm vllm-all-cores app-paced app-one-core app-as-vllm]
                                     [--backends openai openai-chat] [--scoring-requests 200]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Any

from ..lib.report import RESULTS, table
from ..lib.report import page as report_page
from ..serving.client import BACKENDS
from .runs import CHOICES, CONCURRENCY, OUTPUT_LEN, PEERS, SCORING, measure
from .scoring import REQUESTS

COLUMNS = [
    ("peer", "peer", ""),
    ("backend", "backend", ""),
    ("concurrency", "streams", ""),
    ("rounds", "rounds", ""),
    ("failed", "failed", ""),
    ("output_tok_s", "output tok/s", ",.0f"),
    ("tput_vs_vllm", "x vllm", ".2f"),
    ("ttft_p50_s", "TTFT p50 s", ".2f"),
    ("ttft_p99_s", "TTFT p99 s", ".2f"),
    ("ttft_p99_vs_vllm", "x vllm", ".2f"),
    ("itl_p50_ms", "ITL p50 ms", ".3g"),
    ("itl_p99_ms", "ITL p99 ms", ".0f"),
    ("itl_p99_vs_vllm", "x vllm", ".2f"),
    ("cpu_per_1k:engine", "engine CPU s/1k tok", ".2f"),
    ("serving_cpu_per_1k", "serving CPU s/1k tok", ".2f"),
    ("serving_cpu_vs_vllm", "x vllm", ".2f"),
]
SCORING_COLUMNS = [
    ("peer", "peer", ""),
    ("concurrency", "at once", ""),
    ("rounds", "rounds", ""),
    ("failed", "failed", ""),
    ("wall_s", "wall s", ".2f"),
    ("wall_vs_vllm", "x vllm", ".2f"),
    ("request_p50_ms", "request p50 ms", ".1f"),
    ("request_p99_ms", "request p99 ms", ".1f"),
    ("serving_cpu_ms_per_request", "serving CPU ms/request", ".2f"),
]
CPU_COLUMNS = [
    ("peer", "peer", ""),
    ("backend", "backend", ""),
    ("concurrency", "streams", ""),
    ("cpu_per_1k:engine", "engine", ".2f"),
    ("cpu_per_1k:replica", "replica", ".2f"),
    ("cpu_per_1k:proxy", "proxy", ".2f"),
    ("cpu_per_1k:api server", "api server", ".2f"),
    ("cpu_per_1k:agent", "Ray's agent", ".3f"),
    ("cpu_per_1k:other", "other", ".2f"),
]


def page(out: dict[str, Any], minutes: float) -> str:
    """The results page: the medians' table, the CPU by process role, and every run that did not complete."""
    cfg = out["config"]
    rows = [r for r in out["summary"] if r["backend"] != SCORING]
    scoring = [r for r in out["summary"] if r["backend"] == SCORING]
    for r in rows:
        r["ttft_p50_s"], r["ttft_p99_s"] = r["ttft_p50_ms"] / 1000, r["ttft_p99_ms"] / 1000
    about = (
        f"{cfg['model']}; {cfg['dtype']}; each peer alone on the CPU ({cfg['cores']} cores), started afresh in each of "
        f"{cfg['rounds']} round(s), order alternating. `vllm bench serve`: input {cfg['input_len']} tokens, output "
        f"exactly {cfg['output_len']}, streamed, {cfg['prompts_per_slot']}x the concurrency in requests. Medians over "
        "the rounds; `x vllm`: the median of the per-round ratios to vLLM's server as shipped. CPU seconds per 1,000 "
        "output tokens over each client run: the engine, and the serving layer (every other process of the peer)."
    )
    notes = ["CPU seconds per 1,000 output tokens, by process role:", "", table(rows, CPU_COLUMNS), ""]
    if scoring:
        load = cfg["scoring"]
        notes += [
            f"The short-request load: {load['requests']} scoring completions (20-60 tokens, `max_tokens` 1, `echo`, "
            f"`logprobs` 1, greedy), {load['concurrency']} at a time, as an evaluation harness sends them (after a "
            "warm-up of as many). `x vllm`: wall time over vLLM's server's, the median of the per-round ratios "
            "(lower is better); serving CPU: every process but the engine's, per request.",
            "",
            table(scoring, SCORING_COLUMNS),
            "",
        ]
    failed = [
        f"- {r['peer']} / {r['backend']} / {r['concurrency']}: {r['status']}"
        for r in out["summary"]
        if r["status"] != "ok"
    ]
    if failed:
        notes += ["Runs with failed requests (their figures are those of the requests that completed):", *failed, ""]
    title = "The serving path's own cost at GPU token rates (a tiny random model)"
    return report_page(title, about, rows, COLUMNS, notes, minutes)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.fast_engine", description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="64 streams, output 128, one round: a smoke run")
    parser.add_argument(
        "--peers",
        nargs="+",
        choices=CHOICES,
        default=list(PEERS),
        help="app-paced: the app with its streams paced; app-one-core: its engine on one core; app-as-vllm: its engine "
        "set as vLLM's server sets its own",
    )
    parser.add_argument("--backends", nargs="+", choices=list(BACKENDS), default=list(BACKENDS))
    parser.add_argument("--concurrency", nargs="+", type=int, default=None, help=f"default: {CONCURRENCY}")
    parser.add_argument("--rounds", type=int, default=None, help="default: 2 (1 with --quick)")
    parser.add_argument("--output-len", type=int, default=None, help=f"default: {OUTPUT_LEN} (128 with --quick)")
    parser.add_argument(
        "--scoring-requests", type=int, default=None, help=f"the short-request load; 0: none (default: {REQUESTS})"
    )
    args = parser.parse_args(argv)
    if "vllm" not in args.peers:
        parser.error("the ratios are to vllm: keep it among --peers")
    started = time.time()
    out = measure(
        tuple(args.peers),
        tuple(args.backends),
        tuple(args.concurrency or ((64,) if args.quick else CONCURRENCY)),
        args.rounds or (1 if args.quick else 2),
        args.output_len or (128 if args.quick else OUTPUT_LEN),
        REQUESTS if args.scoring_requests is None else args.scoring_requests,
    )
    suffix = "-quick" if args.quick else ""
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / f"fast_engine{suffix}.json").write_text(json.dumps(out, indent=2))
    text = page(out, (time.time() - started) / 60)
    (RESULTS / f"fast_engine{suffix}.md").write_text(text)
    print(text)
    return 0 if all(r["status"] == "ok" for r in out["rows"]) else 1


if __name__ == "__main__":
    sys.exit(main())

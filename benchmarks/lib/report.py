"""The pieces every benchmark reports with: Markdown tables and pages, bar plots in ``benchmarks/results/``, and the
load loops' timing helpers; apart from ``benchmarks.run`` so a benchmark imports them without the orchestration
(percentiles: ``harness.stats``)."""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).resolve().parent.parent / "results"


def stamp(minutes: float) -> str:
    """The line that closes a results page: when it ran and how long it took."""
    return f"_{time.strftime('%Y-%m-%d %H:%M')}, {minutes:.1f} min._"


def write_section(name: str, quick: bool, run: Callable[[bool], str]) -> str:
    """Run a benchmark (``run(quick)`` returns its section) and write the section, stamped, to
    ``results/NAME.md`` (``NAME-quick.md`` for a quick run); the section."""
    started = time.time()
    section = run(quick)
    (RESULTS / f"{name}{'-quick' if quick else ''}.md").write_text(
        f"{section}\n{stamp((time.time() - started) / 60)}\n"
    )
    return section


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


NOT_MEASURED = "–"
"""A table cell with no figure (None or NaN: a peer that has no such measure, or a ratio without its base)."""


def cell(value: Any, spec: str) -> str:
    """One table cell: ``value`` in ``spec`` (``str`` without one), :data:`NOT_MEASURED` where there is none."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return NOT_MEASURED
    return format(value, spec) if spec else str(value)


def table(rows: list[dict[str, Any]], columns: list[tuple[str, str, str]]) -> str:
    """A Markdown table: ``columns`` are (key, header, format)."""
    head = "| " + " | ".join(h for _, h, _ in columns) + " |"
    rule = "|" + "|".join("---" for _ in columns) + "|"
    body = ["| " + " | ".join(cell(r[k], f) for k, _, f in columns) + " |" for r in rows]
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
    return "\n".join([f"### {title}", "", about, "", table(rows, columns), "", *notes, stamp(minutes), ""])


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

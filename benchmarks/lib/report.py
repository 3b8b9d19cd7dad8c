"""The pieces every benchmark reports with: Markdown tables and pages, bar plots in ``benchmarks/results/``, and the
load loops' timing helpers; apart from ``benchmarks.run`` so a benchmark imports them without the orchestration
(percentiles: ``harness.stats``)."""

from __future__ import annotations

import math
import statistics
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


def over_rounds(rows: list[dict[str, Any]], metrics: Iterable[str], key: str = "peer") -> list[dict[str, Any]]:
    """The rows of every round as one row per ``key`` (a peer), in the order first seen: each metric's median over
    the rounds that measured it, and its lowest and highest (``<metric>_range``, None where fewer than two did);
    ``rounds``: how many of the rows are the peer's."""
    out = []
    for name in dict.fromkeys(r[key] for r in rows):
        runs = [r for r in rows if r[key] == name]
        row: dict[str, Any] = {key: name, "rounds": len(runs)}
        for metric in metrics:
            values = [r[metric] for r in runs if isinstance(r.get(metric), int | float) and not math.isnan(r[metric])]
            row[metric] = statistics.median(values) if values else math.nan
            row[f"{metric}_range"] = (min(values), max(values)) if len(values) > 1 else None
        out.append(row)
    return out


def with_ratios(rows: list[dict[str, Any]], named: dict[str, tuple[str, str]]) -> None:
    """Set each row's ratio ``name`` to its ``metric`` over that of the peer ``base`` in the same round (NaN where
    either did not run)."""
    for r in rows:
        for name, (metric, base) in named.items():
            same = (x for x in rows if x["peer"] == base and x.get("round") == r.get("round") and metric in x)
            b = next(same, None)
            r[name] = r[metric] / b[metric] if b is not None and metric in r else math.nan


def not_run(rows: list[dict[str, Any]]) -> list[str]:
    """A page's notes: each peer's round that did not run, and why."""
    return [f"{r['peer']} (round {r.get('round', 0) + 1}): did not run ({r['error']})." for r in rows if "error" in r]


def rounds_told(rows: list[dict[str, Any]]) -> str:
    """What a page's figures are, where the peers ran several rounds."""
    rounds = max((r.get("round", 0) for r in rows), default=0) + 1
    if rounds == 1:
        return ""
    return (
        f" {rounds} rounds, the peers one after the other in each: every figure the median over a peer's rounds, "
        "each ratio taken within a round (its lowest and highest round in brackets)."
    )


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

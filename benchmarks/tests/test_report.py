"""The benchmarks' Markdown tables: a figure a peer does not have (None, NaN) reads as a dash, never ``nan``."""

from __future__ import annotations

import math

from benchmarks.lib.report import NOT_MEASURED, table


def test_a_missing_figure_is_a_dash_and_the_others_keep_their_format():
    rows = [{"peer": "app", "x": 1.234, "n": 3}, {"peer": "ray-serve-llm", "x": math.nan, "n": None}]
    lines = table(rows, [("peer", "peer", ""), ("x", "x", ".2f"), ("n", "n", "d")]).splitlines()
    assert lines[2] == "| app | 1.23 | 3 |"
    assert lines[3] == f"| ray-serve-llm | {NOT_MEASURED} | {NOT_MEASURED} |"


def test_rounds_are_told_as_medians_with_each_ratio_taken_within_its_round():
    """Two rounds of the prefix workload's page (``benchmarks.routing.real_page``): a ratio is each round's own, its
    median and range shown; failures are summed; a round that did not run is a note, not a figure."""
    from benchmarks.routing.real_page import prefix_markdown

    def row(peer: str, round_: int, ttft: float, hits: list[float] | None = None) -> dict:
        figures = {"ttft_p50_s": ttft, "ttft_p99_s": 2 * ttft, "later_ttft_p50_s": ttft, "output_tok_s": 50.0}
        figures |= {"turns_s": 2.0, "cache_hit_rate": 0.5, "held_imbalance": 0.1, "failed": 1}
        return {"peer": peer, "round": round_, "replica_hit_rates": hits or [], **figures}

    rows = [
        row("app-tokens", 0, 1.0, [0.8, 0.6]),
        row("app-tokens-noprefix", 0, 4.0),
        row("app-serve", 0, 2.0),
        row("app-tokens", 1, 3.0, [0.7, 0.7]),
        row("app-tokens-noprefix", 1, 6.0),
        {"peer": "app-serve", "round": 1, "error": "RuntimeError('no replica')"},
    ]
    text = prefix_markdown(rows, "full", 1.0, "0.25 GiB")
    tokens = next(line for line in text.splitlines() if line.startswith("| app-tokens |"))
    cells = [c.strip() for c in tokens.strip("|").split("|")]
    assert cells[1:4] == ["2.00", "0.38 (0.25-0.50)", "0.50"]  # 1/4 and 3/6; against app-serve round 0 alone
    assert "0.80 / 0.60; 0.70 / 0.70" in cells and cells[-1] == "2"  # both rounds' replicas; failures summed
    assert "app-serve (round 2): did not run (RuntimeError('no replica'))." in text
    assert "2 rounds" in text
    assert "4 turns (24 output tokens each)" in text and "--varied-answers" not in text
    varied = prefix_markdown([dict(r) for r in rows], "full", 1.0, "0.25 GiB", varied=True)
    assert "4 turns (12-36 output tokens each, drawn per turn)" in varied and "prefixes --varied-answers`" in varied

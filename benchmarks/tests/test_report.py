"""The benchmarks' Markdown tables: a figure a peer does not have (None, NaN) reads as a dash, never ``nan``."""

from __future__ import annotations

import math

from benchmarks.lib.report import NOT_MEASURED, table


def test_a_missing_figure_is_a_dash_and_the_others_keep_their_format():
    rows = [{"peer": "app", "x": 1.234, "n": 3}, {"peer": "ray-serve-llm", "x": math.nan, "n": None}]
    lines = table(rows, [("peer", "peer", ""), ("x", "x", ".2f"), ("n", "n", "d")]).splitlines()
    assert lines[2] == "| app | 1.23 | 3 |"
    assert lines[3] == f"| ray-serve-llm | {NOT_MEASURED} | {NOT_MEASURED} |"

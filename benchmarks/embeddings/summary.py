"""The embeddings benchmark's summary: medians per peer and scenario with the ratios to the reference peers, the
corpus's token lengths, and the printed table."""

import math
import statistics
from typing import Any

from serve_app.engines.encoder import bundled_encoder_path

from .peers import APP_DTYPE

NUMERIC = (
    "texts_per_s",
    "p50_ms",
    "p99_ms",
    "mean_ms",
    "padding_waste",
    "avg_batch",
    "min_cosine",
    "startup_s",
    "other_cpu",
)


BASES = ("naive", f"naive{APP_DTYPE}", "vllm", f"vllm{APP_DTYPE}")
"""The peers every row is measured against (``x_naive``, ``p50_x_vllm_app_dtype``, ...)."""


def summarize(runs: list[dict[str, Any]], peers: list[str], scenarios: list[str]) -> list[dict[str, Any]]:
    """Medians per (scenario, peer) over its runs; the worst cosine; the ratios to :data:`BASES`' texts/s and
    p50."""
    rows = []
    for scenario in scenarios:
        for peer in peers:
            mine = [r for r in runs if r["peer"] == peer and r["scenario"] == scenario]
            good = [r for r in mine if "texts_per_s" in r]
            row: dict[str, Any] = {"scenario": scenario, "peer": peer, "runs": len(good)}
            for key in NUMERIC:
                values = [r[key] for r in good if not math.isnan(r[key])]
                row[key] = statistics.median(values) if values else math.nan
            row["min_cosine"] = min((r["min_cosine"] for r in good), default=math.nan)
            row["failed"] = sum(r.get("failed", 0) for r in good)
            row["attempts"] = sum(r.get("attempts", 1) for r in good)
            bad = sorted({r["status"] for r in mine if r["status"] != "ok"})
            row["status"] = "; ".join(bad) if bad else "ok"
            row["dtype"] = next((r["dtype"] for r in good), "?")
            rows.append(row)
        for peer in BASES:
            base = next((r for r in rows if r["scenario"] == scenario and r["peer"] == peer), None)
            key = peer.replace("-", "_")
            for row in rows:
                if row["scenario"] != scenario:
                    continue
                ok = base is not None and base["texts_per_s"] > 0
                row[f"x_{key}"] = row["texts_per_s"] / base["texts_per_s"] if ok else math.nan
                row[f"p50_x_{key}"] = row["p50_ms"] / base["p50_ms"] if ok and base["p50_ms"] else math.nan
    return rows


def token_lengths(texts: list[str]) -> dict[str, int]:
    """The corpus's token lengths (special tokens included): its long tail in numbers."""
    from transformers import AutoTokenizer

    lengths = sorted(len(ids) for ids in AutoTokenizer.from_pretrained(str(bundled_encoder_path()))(texts)["input_ids"])
    return {
        "min": lengths[0],
        "p50": lengths[len(lengths) // 2],
        "p90": lengths[int(len(lengths) * 0.9)],
        "p99": lengths[int(len(lengths) * 0.99)],
        "max": lengths[-1],
    }


def print_rows(rows: list[dict[str, Any]]) -> None:
    print(
        f"{'scenario':<8} {'peer':<16} {'dtype':<8} {'texts/s':>8} {'p50 ms':>8} {'p99 ms':>8} {'waste':>6} "
        f"{'batch':>6} {'min cos':>8} {'x naive':>7} {'x n-same':>8} {'x vllm':>7} {'x v-same':>8} {'p50/vllm':>8}"
        "  status"
    )
    for r in rows:
        print(
            f"{r['scenario']:<8} {r['peer']:<16} {r['dtype']:<8} {r['texts_per_s']:8.1f} {r['p50_ms']:8.0f} "
            f"{r['p99_ms']:8.0f} {r['padding_waste']:6.2f} {r['avg_batch']:6.1f} {r['min_cosine']:8.5f} "
            f"{r['x_naive']:7.2f} {r['x_naive_app_dtype']:8.2f} {r['x_vllm']:7.2f} {r['x_vllm_app_dtype']:8.2f} "
            f"{r['p50_x_vllm']:8.2f}  {r['status'][:200]}"
        )

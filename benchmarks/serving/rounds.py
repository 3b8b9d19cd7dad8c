"""The serving benchmark's rounds: every peer in turn (vllm first: its burst throughput sets the overload rate),
more bursts of some afresh, and the bursts' medians and ratios over the rounds."""

from __future__ import annotations

import math
import os
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

from ..lib.peers import DTYPE, MODEL_NAME
from .client import BACKENDS, INPUT_LEN, METRICS, OUTPUT_LEN, RANGE_RATIO, SLO_TPOT_MS, blank, measure_one
from .peers import MAX_MODEL_LEN, PEERS, SLO_INFLIGHT, SLO_QUEUE_WAIT_S, running

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

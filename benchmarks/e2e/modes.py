"""The end-to-end benchmark's modes, each run in a process of its own (one engine on the CPU at a time), and their
rows: the batch job's against offline, the burst's in paired rounds against direct."""

from __future__ import annotations

import json
import math
import statistics
import subprocess
import sys
from typing import Any

from harness.environment import ROOT, offline_env, serve_env

from .app import app_burst, run_app
from .direct import run_direct, run_offline
from .settings import burst_requests, prompts

MODES = ("app-batched", "app-handle", "direct", "offline")
BURST_MODES = ("burst-app", "burst-direct", "burst-app-batch")


def burst_row(runs: list[list[tuple[float, int]]]) -> dict[str, Any]:
    """The median repeat (by wall) of a burst: wall = the last request's latency (all started together)."""
    summaries = []
    for run in runs:
        latencies = sorted(lat for lat, _ in run)
        wall = latencies[-1]
        tokens = sum(n for _, n in run)
        summaries.append(
            {
                "requests": len(run),
                "output_tokens": tokens,
                "wall_s": wall,
                "output_tokens_per_s": tokens / wall,
                "mean_latency_s": statistics.fmean(latencies),
                "p50_latency_s": latencies[len(latencies) // 2],
                "p99_latency_s": latencies[min(len(latencies) - 1, math.ceil(0.99 * len(latencies)) - 1)],
            }
        )
    return sorted(summaries, key=lambda s: s["wall_s"])[len(summaries) // 2]


def run_mode(mode: str, n: int, max_tokens: int, repeats: int, burst: int) -> dict[str, Any]:
    if mode in BURST_MODES:
        requests = burst_requests(burst)
        if mode == "burst-direct":
            result = burst_row(run_direct(requests, repeats))
        else:
            result = burst_row(app_burst(requests, repeats, {"mode": "batch"} if mode == "burst-app-batch" else None))
        result["max_tokens_total"] = sum(m for _, m in requests)
    else:
        texts = prompts(n)
        if mode == "offline":
            result = run_offline(texts, max_tokens, repeats)
        elif mode == "direct":
            runs = run_direct([(t, max_tokens) for t in texts], repeats)
            walls = [max(lat for lat, _ in run) for run in runs]
            result = {"output_tokens": sum(n for _, n in runs[0]), "wall_s": statistics.median(walls)}
        else:
            result = run_app(texts, max_tokens, repeats, via_data=mode == "app-batched")
        result["output_tokens_per_s"] = result["output_tokens"] / result["wall_s"]
    result["mode"] = mode
    return result


def subprocess_mode(mode: str, n: int, max_tokens: int, repeats: int, burst: int) -> dict[str, Any] | str:
    """One mode in its own process; its result row, or the tail of its stderr when it failed."""
    argv = [sys.executable, "-m", "benchmarks.e2e", "--one", mode, "--prompts", str(n), "--max-tokens"]
    argv += [str(max_tokens), "--repeats", str(repeats), "--burst", str(burst)]
    env = offline_env()
    if mode.startswith(("app", "burst-app")):
        env.update(serve_env())  # the Ray Serve settings `make serve` runs the app with
    out = subprocess.run(argv, capture_output=True, text=True, cwd=ROOT, env=env)
    lines = [line for line in out.stdout.splitlines() if line.startswith("{")]
    if out.returncode != 0 or not lines:
        return out.stderr[-3000:] or out.stdout[-3000:]
    return json.loads(lines[-1])


def measure(n: int, max_tokens: int, repeats: int = 1, modes: tuple[str, ...] = MODES) -> list[dict[str, Any]]:
    """Workload 1: each mode in its own process (one engine on the CPU at a time); wall is the median of
    ``repeats``."""
    rows = []
    for mode in modes:
        result = subprocess_mode(mode, n, max_tokens, repeats, 0)
        if isinstance(result, str):  # keep the other modes' results; say what failed
            print(f"{mode} failed:\n{result}", file=sys.stderr)
            result = {"mode": f"{mode} (failed)", "output_tokens": 0, "wall_s": 0.0, "output_tokens_per_s": 0.0}
        rows.append(result)
    ceiling = next((r["output_tokens_per_s"] for r in rows if r["mode"] == "offline"), None)
    for row in rows:
        row["vs_offline"] = row["output_tokens_per_s"] / ceiling if ceiling else math.nan
    return rows


def measure_burst(
    burst: int, repeats: int = 1, modes: tuple[str, ...] = BURST_MODES, rounds: int = 1
) -> list[dict[str, Any]]:
    """Workload 2: the mixed-length burst, each mode in its own process; ratios to ``burst-direct``.

    burst-app and burst-direct run ``rounds`` times each, alternating (direct, app, app, direct, ...), so that
    each ratio is taken between two runs minutes apart: a row holds the medians over its rounds, its ratios
    are the medians of the per-round ratios, with their range. Other modes run once."""
    paired = [m for m in ("burst-direct", "burst-app") if m in modes]
    schedule = [(k, m) for k in range(rounds) for m in (paired[::-1] if k % 2 else paired)]
    schedule += [(0, m) for m in modes if m not in paired]
    runs: dict[str, list[dict[str, Any]]] = {}
    for k, mode in schedule:
        result = subprocess_mode(mode, 0, 0, repeats, burst)
        if isinstance(result, str):
            print(f"{mode} failed:\n{result}", file=sys.stderr)
            nan = math.nan
            result = {"mode": f"{mode} (failed)", "requests": burst, "output_tokens": 0, "wall_s": nan}
            result |= {"output_tokens_per_s": nan, "mean_latency_s": nan, "p50_latency_s": nan, "p99_latency_s": nan}
        result["round"] = k
        runs.setdefault(mode, []).append(result)
    refs = {r["round"]: r for r in runs.get("burst-direct", []) if r["output_tokens_per_s"] > 0}
    rows = []
    for done in runs.values():
        for run in done:  # ratios to burst-direct in the same round (round 0 for the modes run once)
            ref = refs.get(run["round"])
            run["tput_vs_direct"] = run["output_tokens_per_s"] / ref["output_tokens_per_s"] if ref else math.nan
            run["mean_latency_vs_direct"] = run["mean_latency_s"] / ref["mean_latency_s"] if ref else math.nan
        row = {**done[0], "rounds": len(done), "runs": done}
        for key in ("wall_s", "output_tokens_per_s", "mean_latency_s", "p50_latency_s", "p99_latency_s"):
            row[key] = statistics.median(r[key] for r in done)
        for key in ("tput_vs_direct", "mean_latency_vs_direct"):
            ratios = [r[key] for r in done if not math.isnan(r[key])]
            row[key] = statistics.median(ratios) if ratios else math.nan
            row[f"{key}_range"] = (min(ratios), max(ratios)) if ratios else (math.nan, math.nan)
        rows.append(row)
    return rows


def per_round(row: dict[str, Any], key: str) -> str:
    """A burst row's per-round figures of ``key``, as 0.97/1.02/0.99."""
    return "/".join(format(run[key], ".2f") for run in row["runs"])

"""The autoscaling benchmark's results: a policy's row, the page's tables and the plot of replicas and chat
latency."""

from __future__ import annotations

import itertools
import statistics
from pathlib import Path
from typing import Any

from harness.stats import percentile

from ..lib.report import table
from .load import LONG_PROMPTS


def summarize(policy: str, run: dict[str, Any]) -> dict[str, Any]:
    """One row of the comparison table."""
    timeline, chats, longs = run["timeline"], run["chats"], run["longs"]
    ok_chats = [c["latency"] for c in chats if c["status"] == 200]
    ok_longs = [c["latency"] for c in longs if c["status"] == 200]
    late = [c["latency"] for c in chats if c["status"] == 200 and c["at"] >= run["load_s"] / 2]
    up = next((t for t, r, _ in timeline if r >= 2), None)
    down = next((t for t, r, a in timeline if up is not None and t > run["ended_s"] and (r, a) == (1, 1)), None)
    # replica-seconds while the load was on: what the policy spent
    spent = sum(r * (t1 - t0) for (t0, r, _), (t1, _, _) in itertools.pairwise(timeline) if t0 < run["ended_s"])
    prompts_done = len(ok_chats) + LONG_PROMPTS * len(ok_longs)
    return {
        "policy": policy,
        "peak_replicas": max((r for _, r, _ in timeline), default=0),
        "scale_up_s": up if up is not None else float("nan"),
        "scale_down_s": down - run["ended_s"] if down is not None else float("nan"),
        "replica_s": spent,
        "chats": len(chats),
        "chats_503": sum(c["status"] == 503 for c in chats),
        "chat_p50_s": statistics.median(ok_chats) if ok_chats else float("nan"),
        "chat_p99_s": percentile(ok_chats, 99),
        # the second half of the load: after the token policy's scale-up, both policies over the same period
        "chat_p99_late_s": percentile(late, 99),
        "longs": len(ok_longs),
        "longs_503": sum(c["503"] for c in longs),
        "long_p50_s": statistics.median(ok_longs) if ok_longs else float("nan"),
        "long_p99_s": percentile(ok_longs, 99),
        "other_errors": sum(c["status"] not in (200, 503) for c in chats + longs),
        "prompts_per_s": prompts_done / run["ended_s"],
    }


def plot(result: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (top, bottom) = plt.subplots(2, 1, figsize=(8, 6), sharex=True)
    for policy, run in result["runs"].items():
        t = [p[0] for p in run["timeline"]]
        top.step(t, [p[1] for p in run["timeline"]], where="post", label=f"{policy}: running replicas")
        ok = [c for c in run["chats"] if c["status"] == 200]
        bottom.scatter([c["at"] for c in ok], [c["latency"] for c in ok], s=4, label=f"{policy}: chat latency")
        refused = [c["at"] for c in run["chats"] if c["status"] == 503]
        if refused:
            bottom.scatter(refused, [0.0] * len(refused), marker="x", s=10, label=f"{policy}: chat refused (503)")
    load_s = next(iter(result["runs"].values()))["load_s"]
    for ax in (top, bottom):
        ax.axvline(load_s, color="grey", linestyle=":", linewidth=1)
    top.set_ylabel("replicas")
    top.set_yticks([0, 1, 2])
    top.set_ylim(0, 2.5)
    top.set_title("Skewed load (3 clients x 32 long prompts + short chats): requests vs tokens")
    top.legend(loc="lower right", fontsize=8)
    bottom.set_ylabel("chat latency, s")
    bottom.set_xlabel("seconds since the load started (dotted: load stops)")
    bottom.legend(loc="upper right", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def markdown(result: dict[str, Any], png_name: str) -> str:
    """The section for benchmarks/results: the comparison, the pipeline, the plot."""
    cfg = result["config"]
    t = cfg["timings"]
    seconds = lambda value, none: none if value != value else f"{value:.1f}"  # noqa: E731 - NaN: it never did
    rows = [
        {**r, "scale_up_s": seconds(r["scale_up_s"], "never"), "scale_down_s": seconds(r["scale_down_s"], "-")}
        for r in result["rows"]
    ]
    return (
        "### 6. Autoscaling: ongoing requests against tokens (simulated engine, 2 CPUs)\n\n"
        f"**Skewed load** for {cfg['load_s']:g} s: {cfg['long_clients']} closed-loop clients each sending "
        f"`/generate` requests of {cfg['long_prompts']} prompts x {cfg['long_prompt_tokens']} tokens "
        f"(`max_tokens` {cfg['long_max_tokens']}), beside short chats arriving at {cfg['chat_rate_per_s']:g}/s "
        f"(`max_tokens` {cfg['chat_max_tokens']}). One replica's engine holds 8,192 tokens. Autoscaling 1-2 "
        f"replicas, reports every {t['metrics_interval_s']:g} s over a {t['look_back_period_s']:g} s window, "
        f"{t['upscale_delay_s']:g} s upscale and {t['downscale_delay_s']:g} s downscale delay; `requests`: "
        "`target_ongoing_requests: 64`; `tokens`: `metric: tokens`, default target (the replica's in-flight "
        "budget). A replica's batcher queues at most 64 prompts: a request that does not fit gets 503 (chats are "
        "not retried; long requests retry after Retry-After). Scale-up: seconds from the start of the load to a "
        "second replica running; back to 1: seconds after the load ended; replica-s: replicas x seconds during "
        "the load.\n\n"
        + table(
            rows,
            [
                ("policy", "metric", ""),
                ("peak_replicas", "peak replicas", ".0f"),
                ("scale_up_s", "scale-up s", ""),
                ("scale_down_s", "back to 1 s", ""),
                ("replica_s", "replica-s", ".0f"),
                ("chats", "chats", ".0f"),
                ("chats_503", "chats 503", ".0f"),
                ("chat_p50_s", "chat p50 s", ".2f"),
                ("chat_p99_s", "chat p99 s", ".2f"),
                ("chat_p99_late_s", "chat p99 s, 2nd half", ".2f"),
                ("longs", "long requests done", ".0f"),
                ("longs_503", "long 503 (retried)", ".0f"),
                ("long_p50_s", "long p50 s", ".1f"),
                ("long_p99_s", "long p99 s", ".1f"),
                ("other_errors", "other errors", ".0f"),
                ("prompts_per_s", "prompts/s", ".1f"),
            ],
        )
        + "\n\n**Metric pipeline** (`metric: requests`): after a window's worth of idle time, 24 closed-loop "
        "clients against `target_ongoing_requests: 8` (3x the target); seconds from the first request to the "
        "scale-up decision (a second replica starting) and to it running, the median of "
        f"{cfg['pipeline_runs']} run(s).\n\n"
        + table(
            result["pipelines"],
            [
                ("timings", "timings", ""),
                ("decision_s", "decision s", ".1f"),
                ("running_s", "running s", ".1f"),
                ("runs", "each run: decision / running s", ""),
            ],
        )
        + f"\n\n![autoscale]({png_name})\n"
    )

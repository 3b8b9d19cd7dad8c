"""Autoscaling on ongoing requests against autoscaling on tokens, side by side, on a skewed workload; and how
fast Serve's metric pipeline reacts with the app's old and its shipped timings.

**Skewed workload** (the same for both policies, one app at a time on a 2-CPU local Ray cluster): a few
clients send long multi-prompt requests (``POST /generate`` with 32 prompts of about 250 tokens each,
``max_tokens`` 32: about 9,000 tokens a request), closed loop, beside many short chats (``POST
/v1/chat/completions``, about 20 prompt tokens, ``max_tokens`` 16) arriving open loop (Poisson). The engine is
the SIMULATED one with a real cost (a decode step takes longer the more tokens its sequences hold) and a KV
cache of 8,192 tokens, so one replica saturates on the long requests while it holds only a handful of them.

- ``requests``: Serve's policy, ``target_ongoing_requests: 64`` (as shipped). The few long requests plus the
  chats in flight stay far below 64 ongoing requests, so it never adds the second replica.
- ``tokens``: ``autoscaling.metric: tokens`` with the default target (each replica's in-flight budget, here
  8,192 tokens): the tokens held are several budgets, so it scales to 2 and back to 1 when the load ends.

Both use the shipped reporting (every 2 s, a 10 s window, 5 s upscale delay) but a 20 s downscale delay,
so the return to one replica fits the run. Each replica's batcher queues at most 64 prompts; a request that
does not fit is refused at once (503 + Retry-After): chats are not retried, long requests are, after
Retry-After. (A bounded queue rather than ``max_queue_wait_s``: right after a replica starts, that estimate
rests on the few requests it has finished and refused bursts of requests, which blurred the comparison.)

**Pipeline**: after a window's worth of idle time, 24 closed-loop single-prompt clients against
``target_ongoing_requests: 8`` (3x the target), timed from the first request to the scale-up decision (a
second replica starting) and to it running, with the app's old timings and the shipped ones.

    python -m benchmarks.autoscale [--quick]   # benchmarks/results/autoscale[-quick].{json,png,md}
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
from typing import Any

from harness.ports import free_port

from ..lib.report import RESULTS, write_section
from .load import (
    CHAT_MAX_TOKENS,
    ENGINE,
    LONG_CHARS,
    LONG_CLIENTS,
    LONG_MAX_TOKENS,
    LONG_PROMPTS,
    PIPELINES,
    POLICIES,
    SHIPPED,
    deploy,
    pipeline,
    skewed,
)
from .page import markdown, plot, summarize


def measure(quick: bool = False) -> dict[str, Any]:
    """Both experiments on one local Ray cluster (2 CPUs); one app at a time."""
    import ray
    from ray import serve

    load_s, tail_s, chat_rate = (30.0, 35.0, 5.0) if quick else (45.0, 45.0, 6.0)
    pipeline_runs = 1 if quick else 2
    port = free_port()
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    serve.start(http_options={"host": "127.0.0.1", "port": port})
    base = f"http://127.0.0.1:{port}"
    runs, rows, pipelines = {}, [], []
    try:
        for policy, scaling in POLICIES.items():
            app = f"skewed-{policy}"
            deploy(app, {**scaling, **SHIPPED, "downscale_delay_s": 20.0})
            runs[policy] = asyncio.run(skewed(f"{base}/{app}", app, load_s, tail_s, chat_rate, seed=1))
            serve.delete(app)
            rows.append(summarize(policy, runs[policy]))
            print(json.dumps(rows[-1]), flush=True)
        for name, timings in PIPELINES.items():
            if quick and name.startswith("old"):
                continue
            times = []
            for _ in range(pipeline_runs):
                deploy("pipeline", {"target_ongoing_requests": 8, **timings, "downscale_delay_s": 60.0})
                idle = timings["look_back_period_s"] + 2
                times.append(asyncio.run(pipeline(f"{base}/pipeline", "pipeline", idle, 120.0)))
                serve.delete("pipeline")
            pipelines.append(
                {
                    "timings": name,
                    **{k: statistics.median(t[k] or float("nan") for t in times) for k in ("decision_s", "running_s")},
                    "runs": ", ".join(f"{t['decision_s']} / {t['running_s']}" for t in times),
                }
            )
            print(json.dumps(pipelines[-1]), flush=True)
    finally:
        serve.shutdown()
        ray.shutdown()
    config = {
        "load_s": load_s,
        "chat_rate_per_s": chat_rate,
        "long_clients": LONG_CLIENTS,
        "long_prompts": LONG_PROMPTS,
        "long_prompt_tokens": LONG_CHARS // 4,
        "long_max_tokens": LONG_MAX_TOKENS,
        "chat_max_tokens": CHAT_MAX_TOKENS,
        "engine": ENGINE,
        "timings": {**SHIPPED, "downscale_delay_s": 20.0},
        "pipeline_runs": pipeline_runs,
    }
    return {"config": config, "rows": rows, "runs": runs, "pipelines": pipelines}


def run(quick: bool = False) -> str:
    """Measure, write ``autoscale[-quick].json`` and the plot into benchmarks/results, return the section."""
    suffix = "-quick" if quick else ""
    result = measure(quick)
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / f"autoscale{suffix}.json").write_text(json.dumps(result, indent=1))
    plot(result, RESULTS / f"autoscale{suffix}.png")
    return markdown(result, f"autoscale{suffix}.png")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.autoscale", description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args(argv)
    print(write_section("autoscale", args.quick, run))
    return 0


if __name__ == "__main__":
    sys.exit(main())

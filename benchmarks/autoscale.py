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
import itertools
import json
import random
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from harness.ports import free_port
from harness.stats import percentile

from .lib.report import RESULTS

ENGINE = {
    "simulated": {"step_s": 0.02, "step_s_per_token": 2e-6, "max_num_seqs": 32, "kv_cache_tokens": 8_192},
    "batcher": {"max_inflight": 32, "max_queue_size": 64},  # max_inflight_tokens: auto = the KV cache, 8,192
    "cpus_per_replica": 0.25,
}
SHIPPED = {"metrics_interval_s": 2.0, "look_back_period_s": 10.0, "upscale_delay_s": 5.0}
POLICIES = {
    "requests": {"metric": "requests", "target_ongoing_requests": 64},
    "tokens": {"metric": "tokens"},  # target_tokens: each replica's in-flight budget
}
PIPELINES = {
    "old (10 s reports, 30 s window, 5 s delay)": {
        "metrics_interval_s": 10.0,
        "look_back_period_s": 30.0,
        "upscale_delay_s": 5.0,
    },
    "shipped (2 s reports, 10 s window, 5 s delay)": SHIPPED,
}
LONG_CLIENTS, LONG_PROMPTS, LONG_CHARS, LONG_MAX_TOKENS = 3, 32, 1_000, 32
CHAT_CHARS, CHAT_MAX_TOKENS = 80, 16


def _counts(app: str) -> tuple[int, int]:
    """The app's replicas: RUNNING, and all (STARTING included)."""
    from ray import serve

    status = serve.status().applications.get(app)
    if status is None:
        return 0, 0
    states = [d.replica_states for d in status.deployments.values()]
    return sum(s.get("RUNNING", 0) for s in states), sum(sum(s.values()) for s in states)


async def _poll(app: str, start: float, out: list[tuple[float, int, int]], stop: asyncio.Event) -> None:
    while not stop.is_set():
        running, every = await asyncio.to_thread(_counts, app)
        out.append((round(time.monotonic() - start, 2), running, every))
        await asyncio.sleep(0.5)


def _deploy(app: str, autoscaling: dict[str, Any]) -> None:
    from ray import serve

    from serve_app.app import build_app

    args = {"engine": "simulated", **ENGINE, "autoscaling": {"min_replicas": 1, "max_replicas": 2, **autoscaling}}
    serve.run(build_app(args), name=app, route_prefix=f"/{app}")


async def skewed(url: str, app: str, load_s: float, tail_s: float, chat_rate: float, seed: int) -> dict[str, Any]:
    """The skewed workload for ``load_s``; then replicas are watched for up to ``tail_s`` until back to 1."""
    import aiohttp

    rng = random.Random(seed)
    start = time.monotonic()
    stop, stop_poll = asyncio.Event(), asyncio.Event()
    timeline: list[tuple[float, int, int]] = []
    chats: list[dict[str, Any]] = []
    longs: list[dict[str, Any]] = []
    long_body = {"prompts": [f"long {i} " + "x" * LONG_CHARS for i in range(LONG_PROMPTS)]}
    poller = asyncio.create_task(_poll(app, start, timeline, stop_poll))
    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=300)) as session:

        async def long_client(c: int) -> None:
            while not stop.is_set():
                sent, rejected = time.monotonic(), 0
                while True:
                    body = {**long_body, "task_id": f"l{c}", "max_tokens": LONG_MAX_TOKENS}
                    async with session.post(f"{url}/generate", json=body) as response:
                        status, retry = response.status, response.headers.get("Retry-After")
                        await response.read()
                    if status != 503:
                        break
                    rejected += 1
                    await asyncio.sleep(float(retry or 1))
                latency = time.monotonic() - sent
                longs.append({"at": sent - start, "latency": latency, "status": status, "503": rejected})

        async def chat(i: int) -> None:
            sent = time.monotonic()
            body = {
                "messages": [{"role": "user", "content": f"chat {i} " + "y" * CHAT_CHARS}],
                "max_tokens": CHAT_MAX_TOKENS,
            }
            async with session.post(f"{url}/v1/chat/completions", json=body) as response:
                status = response.status
                await response.read()
            chats.append({"at": sent - start, "latency": time.monotonic() - sent, "status": status})

        async def chat_arrivals() -> None:
            tasks, i = [], 0
            while not stop.is_set():
                tasks.append(asyncio.create_task(chat(i)))
                i += 1
                await asyncio.sleep(rng.expovariate(chat_rate))
            await asyncio.gather(*tasks)

        load = asyncio.gather(chat_arrivals(), *(long_client(c) for c in range(LONG_CLIENTS)))
        await asyncio.sleep(load_s)
        stop.set()
        await load
    ended = time.monotonic() - start
    deadline = time.monotonic() + tail_s
    while time.monotonic() < deadline and not (timeline and timeline[-1][1:] == (1, 1) and timeline[-1][0] > ended):
        await asyncio.sleep(0.5)
    stop_poll.set()
    await poller
    return {"timeline": timeline, "chats": chats, "longs": longs, "load_s": load_s, "ended_s": ended}


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


async def pipeline(url: str, app: str, idle_s: float, timeout_s: float) -> dict[str, float | None]:
    """One request, ``idle_s`` of quiet (the window full of idle reports, as when load rises after a lull),
    then 24 closed-loop clients until a second replica runs: seconds to the decision and to it running."""
    import aiohttp

    stop = asyncio.Event()
    timeline: list[tuple[float, int, int]] = []
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=120)) as session:
        async with session.post(f"{url}/generate", json={"prompts": ["warm up"], "max_tokens": 1}) as r:
            await r.read()
        await asyncio.sleep(idle_s)
        start = time.monotonic()
        poller = asyncio.create_task(_poll(app, start, timeline, stop))

        async def client(c: int) -> None:
            k = 0
            while not stop.is_set():
                async with session.post(f"{url}/generate", json={"prompts": [f"c{c} n{k}"], "max_tokens": 8}) as r:
                    await r.read()
                k += 1

        clients = asyncio.gather(*(client(c) for c in range(24)))
        while time.monotonic() - start < timeout_s and not (timeline and timeline[-1][1] >= 2):
            await asyncio.sleep(0.25)
        stop.set()
        await clients
    await poller
    decision = next((t for t, _, a in timeline if a >= 2), None)
    running = next((t for t, r, _ in timeline if r >= 2), None)
    return {"decision_s": decision, "running_s": running}


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
            _deploy(app, {**scaling, **SHIPPED, "downscale_delay_s": 20.0})
            runs[policy] = asyncio.run(skewed(f"{base}/{app}", app, load_s, tail_s, chat_rate, seed=1))
            serve.delete(app)
            rows.append(summarize(policy, runs[policy]))
            print(json.dumps(rows[-1]), flush=True)
        for name, timings in PIPELINES.items():
            if quick and name.startswith("old"):
                continue
            times = []
            for _ in range(pipeline_runs):
                _deploy("pipeline", {"target_ongoing_requests": 8, **timings, "downscale_delay_s": 60.0})
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


def markdown(result: dict[str, Any], png_name: str) -> str:
    """The section for benchmarks/results: the comparison, the pipeline, the plot."""
    from .lib.report import table

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


def run(quick: bool = False) -> str:
    """Measure, write ``autoscale[-quick].json`` and the plot into benchmarks/results, return the section."""
    suffix = "-quick" if quick else ""
    result = measure(quick)
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / f"autoscale{suffix}.json").write_text(json.dumps(result, indent=1))
    plot(result, RESULTS / f"autoscale{suffix}.png")
    return markdown(result, f"autoscale{suffix}.png")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args(argv)
    started = time.time()
    section = run(args.quick)
    stamp = f"\n_{time.strftime('%Y-%m-%d %H:%M')}, {(time.time() - started) / 60:.1f} min._\n"
    (RESULTS / f"autoscale{'-quick' if args.quick else ''}.md").write_text(section + stamp)
    print(section)
    return 0


if __name__ == "__main__":
    sys.exit(main())

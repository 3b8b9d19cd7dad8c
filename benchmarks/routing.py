"""The token-load router against Serve's default router, side by side, on a skewed workload over 4 replicas on
a local 4-node Ray cluster (part (a) of the token-aware fleet; part (b), real vLLM replicas, is elsewhere).

**Fleet**: 4 replicas of the SIMULATED engine, one per node (head + 3 workers of ``ray.cluster_utils.Cluster``,
one logical CPU each, ``cpus_per_replica: 1``), with a cost model where tokens matter: a decode step takes
``step_s + step_s_per_seq x sequences + step_s_per_token x context tokens``, at most ``max_num_seqs`` run, and
the batcher admits up to the KV cache (``kv_cache_tokens``), FIFO; the rest waits in its queue. Ray Serve runs
with ``serve.env`` (as ``make serve``); one HTTP proxy, on the head. Apps differ only in ``routing.router``:
``tokens`` (serve_app/serving/routing.py) or ``serve`` (Serve's power of two choices on ongoing requests).

**Workloads** (the same seeded schedule for both routers, open loop, through ``DeploymentHandle`` calls from
this process, whose router is the one under test): interactive requests arrive as a Poisson process, each a
streamed ``generate_stream`` (``handle.options(stream=True)``: the first delta gives the TTFT) with a prompt of
20-400 tokens and an output length drawn log-uniformly (density ~ 1/x: most are short, a few very long); beside
them ``generate_batch`` calls (what one ``/generate`` request of many prompts, or a Ray Data batch, is to Serve:
one ongoing request) at fixed times.

- ``full`` / ``quick``: outputs of 8-1024 tokens at 6/s, and a few batches of 256 prompts x 128 tokens (about
  45k tokens each, three times a replica's KV cache) over 60 s (``quick``: 30 s, one round).
- ``check``: short chats (8-64 tokens) at 8/s, a 48-prompt batch every second for 20 s, alternately with 256- and
  32-token answers (two jobs), and 12 HTTP chats through the proxy (its router prices them by their body's length).
  It is also tests/test_routing.py's multi-node scenario (``--check``: prints ``RESULT {json}``, writes nothing).

Output tok/s: all output tokens / (last answer - first request). The spread: max - min of the tokens each replica
holds (its own report, ``record_routing_stats``, read from every replica every 0.25 s) while the load runs. Rounds
alternate the order (tokens, serve, serve, tokens); percentiles pool the rounds.

    python -m benchmarks.routing [--quick]   # benchmarks/results/routing[-quick].{md,json,png}
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import random
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from harness.ports import free_port
from harness.replicas import replica_actors
from harness.stats import percentile

from .lib.report import RESULTS, table

REPLICAS = 4
ROUTERS = ("tokens", "serve")
SAMPLE_S = 0.25

ENGINE: dict[str, Any] = {
    "engine": "simulated",
    # A decode step: 10 ms + 0.1 ms a sequence + 0.5 ms per 1,000 context tokens; 64 sequences and 16k tokens of
    # KV cache per replica (the batcher's budget is the cache): about 2,500 tok/s per replica when full.
    "simulated": {
        "step_s": 0.01,
        "step_s_per_seq": 1e-4,
        "step_s_per_token": 5e-7,
        "max_num_seqs": 64,
        "kv_cache_tokens": 16_384,
    },
    "cpus_per_replica": 1.0,
    "max_ongoing_requests": 4_096,
    "autoscaling": {"min_replicas": REPLICAS, "max_replicas": REPLICAS, "target_ongoing_requests": 64},
}

WORKLOADS: dict[str, dict[str, Any]] = {
    # seconds of arrivals, interactive requests/s, batch calls (at these seconds) of `prompts` x `max_tokens`
    "full": {"load_s": 60.0, "rate": 6.0, "batch_at": [5.0, 20.0, 35.0, 50.0], "prompts": 256, "batch_max": 128},
    "quick": {"load_s": 30.0, "rate": 6.0, "batch_at": [4.0, 16.0], "prompts": 256, "batch_max": 128},
    "check": {
        "load_s": 20.0,
        "rate": 8.0,
        "batch_at": [1.0 * i for i in range(20)],
        "prompts": 48,
        "batch_max": [256, 32],  # two jobs' batches: long answers, short ones
        "http_chats": 12,
        "max_output": 64,
    },
}


def schedule(workload: dict[str, Any], seed: int) -> list[dict[str, Any]]:
    """The requests (``at`` seconds after the start), the same for every router."""
    rng = random.Random(seed)
    events: list[dict[str, Any]] = []
    t, i = rng.expovariate(workload["rate"]), 0
    top = workload.get("max_output", 1_024)
    while t < workload["load_s"]:
        prompt = f"user {i} asks " + "about tokens " * rng.randint(6, 120)  # 20-400 tokens
        tokens = int(math.exp(rng.uniform(math.log(8), math.log(top + 1))))  # log-uniform 8..top
        events.append({"at": t, "kind": "stream", "prompt": prompt, "max_tokens": min(tokens, top)})
        t, i = t + rng.expovariate(workload["rate"]), i + 1
    lengths = workload["batch_max"] if isinstance(workload["batch_max"], list) else [workload["batch_max"]]
    for b, at in enumerate(workload["batch_at"]):
        prompts = [f"batch {b} row {j} " + "summarize this " * 12 for j in range(workload["prompts"])]
        events.append({"at": at, "kind": "batch", "prompts": prompts, "max_tokens": lengths[b % len(lengths)]})
    for h in range(workload.get("http_chats", 0)):
        at = workload["load_s"] * (h + 0.5) / workload["http_chats"]
        events.append({"at": at, "kind": "http", "content": f"http chat {h} " + "hello " * 20, "max_tokens": 16})
    return sorted(events, key=lambda e: e["at"])


# -- The cluster and the apps -------------------------------------------------------------------------------


def start_cluster() -> tuple[Any, str]:
    """A local Ray cluster of ``REPLICAS`` nodes (one logical CPU each) with Serve on it; the HTTP base URL."""
    from harness.environment import use_serve_env

    use_serve_env()  # make serve's settings, before ray.serve is imported
    import ray
    from ray import serve
    from ray.cluster_utils import Cluster

    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "include_dashboard": False})
    for _ in range(REPLICAS - 1):
        cluster.add_node(num_cpus=1)
    ray.init(address=cluster.address, log_to_driver=False)
    port = free_port()
    serve.start(proxy_location="HeadOnly", http_options={"host": "127.0.0.1", "port": port})
    return cluster, f"http://127.0.0.1:{port}"


def node_of(actor: Any) -> str:
    from ray._private import state

    return state.actors(actor_id=actor._actor_id.hex())["Address"]["NodeID"]


async def deploy(router: str) -> tuple[Any, dict[str, Any]]:
    """The app with ``router``, its ``REPLICAS`` replicas up and (token router) reporting; (handle, actors)."""
    from ray import serve

    from serve_app.app import build_app

    app = f"route-{router}"
    args = {**ENGINE, "routing": {"router": router}}
    handle = await asyncio.to_thread(serve.run, build_app(args), name=app, route_prefix=f"/{app}")
    actors: dict[str, Any] = {}
    deadline = time.monotonic() + 120
    while len(actors) < REPLICAS:
        assert time.monotonic() < deadline, f"only {len(actors)} replicas of {app}"
        await asyncio.sleep(0.5)
        actors = replica_actors(app)
    reports = await asyncio.gather(*(a.record_routing_stats.remote() for a in actors.values()))
    assert all("token_load" in r for r in reports), reports
    for i in range(2 * REPLICAS):  # warm up every replica and the router's view of them
        await handle.generate.remote(f"warm up {i}", max_tokens=2)
    await asyncio.sleep(3.0)  # two report periods (Serve's control loop runs once a second here)
    return handle, actors


async def per_replica(handle: Any, replicas: int, timeout_s: float = 60.0) -> dict[str, dict[str, Any]]:
    """Each replica's ``stats()`` by replica id (calls land wherever the router sends them, until all answered)."""
    seen: dict[str, dict[str, Any]] = {}
    deadline = time.monotonic() + timeout_s
    while len(seen) < replicas and time.monotonic() < deadline:
        stats = await handle.stats.remote()
        seen[stats["replica"]["replica_id"]] = stats
    return seen


# -- One run ------------------------------------------------------------------------------------------------


async def run_once(router: str, events: list[dict[str, Any]], base_url: str) -> dict[str, Any]:
    """Deploy, play ``events``, sample the tokens held, delete; everything measured."""
    import aiohttp
    from ray import serve

    handle, actors = await deploy(router)
    app = f"route-{router}"
    before = await per_replica(handle, REPLICAS)
    streams: list[dict[str, Any]] = []
    batches: list[dict[str, Any]] = []
    https: list[dict[str, Any]] = []
    errors: list[str] = []
    samples: list[tuple[float, list[float]]] = []
    stop = asyncio.Event()
    start = time.monotonic()

    async def sample() -> None:
        ids = sorted(actors)
        while not stop.is_set():
            reports = await asyncio.gather(*(actors[i].record_routing_stats.remote() for i in ids))
            samples.append((time.monotonic() - start, [r["token_load"] for r in reports]))
            await asyncio.sleep(SAMPLE_S)

    async def stream(e: dict[str, Any]) -> None:
        sent, first, result = time.monotonic(), None, None
        try:
            call = handle.options(stream=True).generate_stream.remote(e["prompt"], max_tokens=e["max_tokens"])
            async for item in call:
                first = first or time.monotonic()
                if item["type"] == "result":
                    result = item
            assert result is not None, "no result"
            streams.append(
                {
                    "at": sent - start,
                    "ttft": first - sent,  # type: ignore[operator]
                    "e2e": time.monotonic() - sent,
                    "tokens": result["output_tokens"],
                    "done": time.monotonic() - start,
                }
            )
        except Exception as exc:
            errors.append(f"stream: {exc!r}"[:300])

    async def batch(e: dict[str, Any]) -> None:
        sent = time.monotonic()
        try:
            rows = await handle.generate_batch.remote(e["prompts"], max_tokens=e["max_tokens"])
            errors.extend(f"batch row: {r['error']}" for r in rows if r["error"] is not None)
            tokens = sum(r["output_tokens"] for r in rows if r["error"] is None)
            batches.append({"at": sent - start, "e2e": time.monotonic() - sent, "tokens": tokens, "rows": len(rows)})
            batches[-1]["done"] = time.monotonic() - start
        except Exception as exc:
            errors.append(f"batch: {exc!r}"[:300])

    async def http(e: dict[str, Any], session: aiohttp.ClientSession) -> None:
        body = {"messages": [{"role": "user", "content": e["content"]}], "max_tokens": e["max_tokens"]}
        try:
            async with session.post(f"{base_url}/{app}/v1/chat/completions", json=body) as response:
                answer = await response.json()
            if response.status != 200:
                raise RuntimeError(f"{response.status}: {answer}")
            https.append({"tokens": answer["usage"]["completion_tokens"], "done": time.monotonic() - start})
        except Exception as exc:
            errors.append(f"http: {exc!r}"[:300])

    sampler = asyncio.create_task(sample())
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=600)) as session:
        tasks = []
        for e in events:
            await asyncio.sleep(max(0.0, e["at"] - (time.monotonic() - start)))
            work = stream(e) if e["kind"] == "stream" else batch(e) if e["kind"] == "batch" else http(e, session)
            tasks.append(asyncio.create_task(work))
        await asyncio.gather(*tasks)
    ended = time.monotonic() - start
    stop.set()
    await sampler
    after = await per_replica(handle, REPLICAS)
    nodes = {rid: await asyncio.to_thread(node_of, actor) for rid, actor in actors.items()}
    await asyncio.to_thread(serve.delete, app)
    ran = {
        rid: s["engine_stats"]["requests"]
        - before.get(rid, {"engine_stats": {"requests": 0}})["engine_stats"]["requests"]
        for rid, s in after.items()
    }
    return {
        "router": router,
        "streams": streams,
        "batches": batches,
        "https": https,
        "errors": errors,
        "samples": samples,
        "ended_s": ended,
        "nodes": nodes,
        "sent": len(events),
        "answered": len(streams) + len(batches) + len(https),
        "prompts_sent": sum(len(e["prompts"]) if e["kind"] == "batch" else 1 for e in events),
        "prompts_run": sum(ran.values()),
        "prompts_per_replica": ran,
        "replicas_seen": len(after),
    }


def summarize(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """One router's figures over its rounds (percentiles pooled)."""
    streams = [s for r in runs for s in r["streams"]]
    batches = [b for r in runs for b in r["batches"]]
    spreads = [max(loads) - min(loads) for r in runs for t, loads in r["samples"] if t <= r["ended_s"]]
    tok_s = [
        (
            sum(s["tokens"] for s in r["streams"])
            + sum(b["tokens"] for b in r["batches"])
            + sum(h["tokens"] for h in r["https"])
        )
        / r["ended_s"]
        for r in runs
    ]
    return {
        "router": runs[0]["router"],
        "rounds": len(runs),
        "output_tok_s": statistics.mean(tok_s),
        "ttft_p50_s": percentile([s["ttft"] for s in streams], 50),
        "ttft_p99_s": percentile([s["ttft"] for s in streams], 99),
        "e2e_p50_s": percentile([s["e2e"] for s in streams], 50),
        "e2e_p99_s": percentile([s["e2e"] for s in streams], 99),
        "batch_e2e_mean_s": statistics.mean(b["e2e"] for b in batches) if batches else math.nan,
        "batch_e2e_max_s": max((b["e2e"] for b in batches), default=math.nan),
        "spread_mean": statistics.mean(spreads) if spreads else math.nan,
        "spread_p90": percentile(spreads, 90),
        "spread_max": max(spreads, default=math.nan),
        "errors": [e for r in runs for e in r["errors"]],
        "streams": len(streams),
        "batches": len(batches),
    }


async def measure(plan: list[tuple[str, int]], seed: int = 7) -> dict[str, Any]:
    """Each ``(workload, rounds)`` of ``plan`` through both routers on one cluster, alternating which goes first."""
    cluster, base_url = start_cluster()  # first: it sets serve.env's settings before ray.serve is imported
    import ray
    from ray import serve

    scenarios: dict[str, Any] = {}
    try:
        for mode, rounds in plan:
            events = schedule(WORKLOADS[mode], seed)
            runs: dict[str, list[dict[str, Any]]] = {r: [] for r in ROUTERS}
            for k in range(rounds):
                for router in ROUTERS if k % 2 == 0 else ROUTERS[::-1]:
                    run = await run_once(router, events, base_url)
                    runs[router].append(run)
                    brief = {key: run[key] for key in ("router", "answered", "sent", "prompts_run", "prompts_sent")}
                    print(json.dumps({"workload": mode, **brief, "errors": len(run["errors"])}), flush=True)
            scenarios[mode] = {"workload": WORKLOADS[mode], "rounds": rounds, "runs": runs}
    finally:
        serve.shutdown()
        ray.shutdown()
        cluster.shutdown()
    return {"engine": ENGINE, "seed": seed, "scenarios": scenarios}


def check() -> dict[str, Any]:
    """The test's scenario: per router, whether every request was answered once, where replicas ran, the spread."""
    result = asyncio.run(measure([("check", 1)]))
    out = {}
    for router, (run,) in result["scenarios"]["check"]["runs"].items():
        s = summarize([run])
        out[router] = {
            **{
                k: run[k]
                for k in ("sent", "answered", "prompts_sent", "prompts_run", "replicas_seen", "nodes", "errors")
            },
            "samples": len(run["samples"]),
            **{k: s[k] for k in ("spread_mean", "spread_p90", "ttft_p99_s", "output_tok_s")},
        }
    return out


# -- Report -------------------------------------------------------------------------------------------------

TITLES = {
    "full": "256-prompt batches among streamed requests",
    "quick": "256-prompt batches among streamed requests",
    "check": "many 48-prompt batches (long and short answers) among short streamed chats",
}


def plot(result: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    scenarios = result["scenarios"]
    fig, axes = plt.subplots(len(scenarios), 2, figsize=(12, 3.2 * len(scenarios)), sharex="row", sharey="row")
    axes = [axes] if len(scenarios) == 1 else axes
    for row, (mode, scenario) in zip(axes, scenarios.items()):
        for ax, router in zip(row, ROUTERS):
            run = scenario["runs"][router][0]
            t = [s[0] for s in run["samples"]]
            for i in range(REPLICAS):
                ax.plot(t, [s[1][i] / 1_000 for s in run["samples"]], linewidth=1, label=f"replica {i}")
            ax.set_title(f"{TITLES[mode]}\n{router} router: tokens held per replica", fontsize=9)
            ax.set_ylabel("k tokens")
            ax.set_xlabel("seconds since the first request")
        row[0].legend(fontsize=7, loc="upper right")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


COLUMNS = [
    ("output_tok_s", "output tok/s", ".0f"),
    ("ttft_p50_s", "TTFT p50 s", ".2f"),
    ("ttft_p99_s", "TTFT p99 s", ".2f"),
    ("e2e_p99_s", "E2E p99 s", ".2f"),
    ("spread_mean", "spread mean (tokens)", ".0f"),
    ("spread_p90", "spread p90 (tokens)", ".0f"),
]


def section(mode: str, scenario: dict[str, Any], rows: list[dict[str, Any]]) -> str:
    """One workload's table and ratios."""
    w = scenario["workload"]
    tokens, serve_row = rows
    ratio = {
        "measure": "token / Serve's",
        **{k: tokens[k] / serve_row[k] if serve_row[k] else math.nan for k, _, _ in COLUMNS},
    }
    top = w.get("max_output", 1_024)
    lengths = w["batch_max"] if isinstance(w["batch_max"], list) else [w["batch_max"]]
    extra = f", and {w['http_chats']} HTTP chats through the proxy" if w.get("http_chats") else ""
    return (
        f"#### {TITLES[mode]}\n\n"
        f"Open loop over {w['load_s']:g} s: streamed `generate_stream` calls at {w['rate']:g}/s (Poisson), prompts "
        f"of 20-400 tokens, outputs log-uniform in 8-{top} tokens; {len(w['batch_at'])} `generate_batch` calls of "
        f"{w['prompts']} prompts x {' or '.join(str(n) for n in lengths)} tokens{extra}. "
        f"{scenario['rounds']} round(s) per router.\n\n"
        + table(
            rows,
            [
                ("router", "router", ""),
                *COLUMNS,
                ("batch_e2e_mean_s", "batch E2E mean s", ".1f"),
                ("batch_e2e_max_s", "batch E2E max s", ".1f"),
            ],
        )
        + "\n\nRatios (tok/s: higher is better; the rest: lower is better):\n\n"
        + table([ratio], [("measure", "", ""), *[(k, h, ".2f") for k, h, _ in COLUMNS]])
        + "\n"
    )


def markdown(result: dict[str, Any], png_name: str) -> str:
    sim = ENGINE["simulated"]
    return (
        "### Token-load router vs Serve's default router (simulated engine, 4 replicas on 4 nodes)\n\n"
        f"4 replicas of the SIMULATED engine, one per node of a local 4-node Ray cluster (2 cores in all), "
        f"`serve.env` settings, routing statistics every 1 s. Engine: a decode step {sim['step_s'] * 1e3:g} ms + "
        f"{sim['step_s_per_seq'] * 1e3:g} ms per sequence + {sim['step_s_per_token'] * 1e6:g} ms per 1,000 context "
        f"tokens; {sim['max_num_seqs']} sequences and {sim['kv_cache_tokens']:,} tokens of KV cache (the batcher's "
        "budget, FIFO) per replica. The same seeded schedule for both routers, through `DeploymentHandle` calls "
        "(the router under test runs in the caller); rounds alternate which router goes first; percentiles pool "
        "the rounds. Output tok/s: all output tokens / (last answer - first request). TTFT: the first streamed "
        "delta. Spread: max - min of the tokens held by the 4 replicas (their own reports, sampled every 0.25 s "
        "while the load ran); one batch cannot be split, so while fewer batches run than there are replicas the "
        "spread cannot fall below one batch's tokens.\n\n"
        + "\n".join(section(mode, sc, sc["summary"]) for mode, sc in result["scenarios"].items())
        + f"\n![tokens held per replica]({png_name})\n"
    )


def rounded(value: Any) -> Any:
    """``value`` with its floats to 3 decimals (the JSON holds every request and sample)."""
    if isinstance(value, float):
        return round(value, 3)
    if isinstance(value, dict):
        return {k: rounded(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [rounded(v) for v in value]
    return value


def run(quick: bool) -> str:
    plan = [("quick", 1)] if quick else [("full", 2), ("check", 2)]
    result = asyncio.run(measure(plan))
    for scenario in result["scenarios"].values():
        scenario["summary"] = [summarize(scenario["runs"][r]) for r in ROUTERS]
    suffix = "-quick" if quick else ""
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / f"routing{suffix}.json").write_text(json.dumps(rounded(result), default=str))
    try:
        plot(result, RESULTS / f"routing{suffix}.png")
    except ImportError as exc:  # matplotlib is in the bench extra only
        print(f"no plot: {exc}", file=sys.stderr)
    return markdown(result, f"routing{suffix}.png")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="one round of 30 s per router (a few minutes)")
    parser.add_argument("--check", action="store_true", help="tests/test_routing.py's scenario: prints RESULT json")
    args = parser.parse_args(argv)
    if args.check:
        print("RESULT " + json.dumps(check()), flush=True)
        return 0
    started = time.time()
    section = run(args.quick)
    stamp = f"\n_{time.strftime('%Y-%m-%d %H:%M')}, {(time.time() - started) / 60:.1f} min._\n"
    (RESULTS / f"routing{'-quick' if args.quick else ''}.md").write_text(section + stamp)
    print(section)
    return 0


if __name__ == "__main__":
    sys.exit(main())

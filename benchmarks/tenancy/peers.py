"""The tenancy benchmark's peers (vLLM's server and the app's variants) and one peer's three phases: the job alone,
the online load alone, then both."""

from __future__ import annotations

import asyncio
import math
import threading
import time
from pathlib import Path
from typing import Any

from serve_app.engines.async_llm import CPU_STEP_TOKENS
from serve_app.engines.vllm_engine import paced_step_tokens

from ..lib.peers import PYTHON_PROXY
from ..lib.report import after, timeline
from ..serving.peers import running
from .job import JOB_PRIORITY, app_job, vllm_job
from .online import ONLINE_SHARE, ONLINE_TOKENS, online_load, online_row, window_ttfts

SMALL_SHARE = 0.125
SMALL_STEP_TOKENS = 256
CPU_STEP_CAP = paced_step_tokens(CPU_STEP_TOKENS)  # the job's step cap the app's `auto` gives on a CPU
APP_PEERS: dict[str, dict[str, Any]] = {  # the app's variants: the job's priority, `running`'s batcher, fleet, env
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


def run_job(peer: str, url: str, ray_tmp: str, path: Path, workdir: Path) -> dict[str, Any]:
    if peer == "vllm":
        return asyncio.run(vllm_job(url, path, JOB_PRIORITY))
    priority = APP_PEERS[peer]["priority"]
    return app_job(ray_tmp, path, workdir / f"out-{time.monotonic_ns()}", priority)


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

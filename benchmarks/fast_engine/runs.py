"""The fast-engine benchmark's rounds: each peer started afresh on the tiny model, in alternating order per round,
``vllm bench serve`` at each concurrency and backend, the CPU each of the peer's processes spent during each client
run, and per-round ratios to vLLM's server as shipped."""

from __future__ import annotations

import math
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from harness.launcher import merged
from harness.vllm_bench import ClientFailed, bench_serve

from ..lib.peers import DTYPE, MODEL_NAME
from ..serving.client import BACKENDS, WARMUPS, summarize
from ..serving.peers import running
from .cpu import ROLES, Sampler
from .model import TINY, make_tiny_model
from .scoring import CONCURRENCY as SCORING_CONCURRENCY
from .scoring import REQUESTS as SCORING_REQUESTS
from .scoring import prompts, score

PEERS = ("app", "vllm", "vllm-all-cores")
PACED = "app-paced"
PACED_INTERVAL_S = 0.03
"""``app-paced`` (not run unless named): the app with ``batcher.stream_interval_s`` at this, each stream at most one
chunk per 30 ms (off in the shipped config)."""
ONE_CORE = "app-one-core"
"""``app-one-core`` (not run unless named): the app with its engine computing on one core and the other kept
(``vllm.cpu_reserved_cores: 1``), the layout vLLM's CPU build ships, so the serving layers meet on equal engines."""
AS_VLLM = "app-as-vllm"
"""``app-as-vllm`` (not run unless named): the app's engine set as ``vllm serve`` sets its own on a CPU, one core kept
and vLLM's own step size (``vllm.max_num_batched_tokens: null``, 2048 tokens, where the app's ``auto`` keeps a CPU's
steps at 512), so the two differ only in their serving layers. Both are started by their names, as the serving
benchmark's app peers that change only the app's ``vllm`` settings (``APP_VLLM``)."""
CHOICES = (*PEERS, PACED, ONE_CORE, AS_VLLM)
INPUT_LEN, OUTPUT_LEN = 128, 256
CONCURRENCY = (64, 256, 1024)
PROMPTS_PER_SLOT = 2
"""Requests per run: this many times the concurrency, so every slot is refilled once after the first wave."""
RATIOS = {  # this benchmark's ratios to vllm, per round: (row key, name)
    "output_tok_s": "tput_vs_vllm",
    "ttft_p99_ms": "ttft_p99_vs_vllm",
    "itl_p99_ms": "itl_p99_vs_vllm",
    "serving_cpu_per_1k": "serving_cpu_vs_vllm",
    "wall_s": "wall_vs_vllm",  # the scoring load's
}
SCORING = "scoring"
"""The short-request load's rows' backend (``benchmarks.fast_engine.scoring``)."""
FIGURES = (
    "output_tok_s",
    "ttft_p50_ms",
    "ttft_p99_ms",
    "itl_p50_ms",
    "itl_p99_ms",
    "serving_cpu_per_1k",
    *(f"cpu_per_1k:{r}" for r in ROLES),
    "wall_s",
    "request_p50_ms",
    "request_p99_ms",
    "serving_cpu_ms_per_request",
)


def client_argv(url: str, backend: str, folder: Path, concurrency: int, prompts: int, output_len: int) -> list[str]:
    """``vllm bench serve``'s arguments: ``prompts`` random prompts of :data:`INPUT_LEN` tokens, each answered with
    exactly ``output_len`` (``ignore_eos``), streamed, at most ``concurrency`` at once."""
    return [
        *("--backend", backend, "--base-url", url, "--endpoint", BACKENDS[backend]),
        *("--model", MODEL_NAME, "--served-model-name", MODEL_NAME, "--tokenizer", str(folder)),
        *("--dataset-name", "random", "--random-input-len", str(INPUT_LEN), "--random-output-len", str(output_len)),
        *("--random-range-ratio", "0", "--num-prompts", str(prompts), "--max-concurrency", str(concurrency)),
        *("--request-rate", "inf", "--seed", "0", "--temperature", "0", "--ignore-eos"),
        *("--ready-check-timeout-sec", "120", "--num-warmups", str(WARMUPS)),
        *("--percentile-metrics", "ttft,tpot,itl,e2el", "--metric-percentiles", "50,99"),
        *("--disable-tqdm", "--save-result", "--save-detailed"),
    ]


def measure_one(url: str, marker: str, backend: str, folder: Path, workdir: Path, concurrency: int, output_len: int):
    """One client run in its own subprocess; (status, metrics) with the CPU seconds the peer's processes spent per
    1,000 output tokens, by role and by process name (``cpu_per_1k_by_process``), over the client's measured phase:
    the ``duration`` it reports, ending when it saved its result (a second or so late: the result is written after
    the metrics are computed)."""
    result = workdir / f"client-{backend}-{concurrency}-{time.monotonic_ns()}.json"
    argv = client_argv(url, backend, folder, concurrency, PROMPTS_PER_SLOT * concurrency, output_len)
    try:
        with Sampler(marker) as sampler:
            raw = bench_serve(argv, result, timeout_s=3600)
    except ClientFailed as exc:
        return str(exc), {}
    end = result.stat().st_mtime - time.time() + time.monotonic()  # the file's wall clock on the monotonic one
    start = end - float(raw.get("duration") or 0.0)
    cpu = sampler.spent_between(start, end)
    metrics = summarize(raw)
    tokens = raw.get("total_output_tokens") or 0
    for name, seconds in cpu.items():
        metrics[f"cpu_per_1k:{name}"] = 1000 * seconds / tokens if tokens else math.nan
    by_process = sampler.by_name_between(start, end).items()
    metrics["cpu_per_1k_by_process"] = {name: 1000 * s / tokens for name, s in by_process if s > 0} if tokens else {}
    metrics["serving_cpu_per_1k"] = 1000 * serving_cpu(cpu) / tokens if tokens else math.nan
    return run_status(metrics["failed"], metrics["errors"]), metrics


def measure_scoring(url: str, marker: str, texts: list[str]) -> tuple[str, dict[str, Any]]:
    """The short-request load once (``benchmarks.fast_engine.scoring``), with the CPU the peer's serving layer
    (every process but the engine) spent per request during it."""
    with Sampler(marker) as sampler:
        metrics = score(url, texts)
        ended = time.monotonic()
    serving = serving_cpu(sampler.spent_between(ended - metrics["wall_s"], ended))
    metrics["serving_cpu_ms_per_request"] = 1000 * serving / metrics["completed"] if metrics["completed"] else math.nan
    return run_status(metrics["failed"], metrics.pop("errors")), metrics


def serving_cpu(cpu: dict[str, float]) -> float:
    """The serving layer's CPU seconds: every role's but the engine's."""
    return sum(seconds for name, seconds in cpu.items() if name != "engine")


def run_status(failed: int, errors: list[str]) -> str:
    """A run's status: ``ok``, or how many requests failed and the first errors."""
    return "ok" if failed == 0 else f"{failed} failed: {'; '.join(errors)[:300]}"


def started_as(peer: str, fleet: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    """What :func:`~benchmarks.serving.peers.running` starts for ``peer``, and the app's args over ``fleet``:
    ``app-paced`` is the app with its streams paced."""
    if peer == PACED:
        return "app", merged(fleet, {"batcher": {"stream_interval_s": PACED_INTERVAL_S}})
    return peer, fleet


def measure(
    peers: tuple[str, ...] = PEERS,
    backends: tuple[str, ...] = tuple(BACKENDS),
    concurrencies: tuple[int, ...] = CONCURRENCY,
    rounds: int = 2,
    output_len: int = OUTPUT_LEN,
    scoring_requests: int = SCORING_REQUESTS,
) -> dict[str, Any]:
    """Every peer in every round (the order reversed in odd rounds), each started afresh on the tiny model; a dict
    with ``rows`` (one per round x peer x backend x concurrency), ``summary`` (medians over the rounds, and the
    medians of the per-round ratios to vllm) and the ``config``. Never raises for a peer that fails."""
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="fast-engine-") as tmp:
        folder = make_tiny_model(Path(tmp) / "tiny-llama")
        fleet = {"model": str(folder), "served_model_name": MODEL_NAME}  # the app on the tiny model, by the same name
        texts = prompts(folder, scoring_requests) if scoring_requests else []
        loads = [(b, c) for b in backends for c in concurrencies] + ([(SCORING, SCORING_CONCURRENCY)] if texts else [])
        for rnd in range(rounds):
            for peer in peers[::-1] if rnd % 2 else peers:
                workdir = Path(tmp) / f"{peer}-{rnd}"
                workdir.mkdir()
                print(f"[fast_engine] round {rnd}: starting {peer}", file=sys.stderr, flush=True)
                done: set[tuple[str, int]] = set()
                kind, args = started_as(peer, fleet)
                try:
                    with running(kind, folder, workdir, 900, fleet=args) as (url, startup_s, marker):
                        for backend, c in loads:
                            if backend == SCORING:
                                status, metrics = measure_scoring(url, marker, texts)
                            else:
                                status, metrics = measure_one(url, marker, backend, folder, workdir, c, output_len)
                            rows.append(row(peer, backend, c, rnd, status, startup_s=startup_s, **metrics))
                            done.add((backend, c))
                            print(f"[fast_engine] {peer} {backend} x{c}: {status}", file=sys.stderr, flush=True)
                except RuntimeError as exc:
                    print(f"[fast_engine] {peer} did not deploy: {exc}", file=sys.stderr, flush=True)
                    missed = [load for load in loads if load not in done]
                    rows += [row(peer, b, c, rnd, f"did not deploy: {exc}") for b, c in missed]
    add_ratios(rows)
    return {
        "config": {
            "model": f"tiny random Llama from {MODEL_NAME}'s config and tokenizer: {TINY}",
            "dtype": DTYPE,
            "input_len": INPUT_LEN,
            "output_len": output_len,
            "prompts_per_slot": PROMPTS_PER_SLOT,
            "concurrency": list(concurrencies),
            "scoring": {"requests": len(texts), "concurrency": SCORING_CONCURRENCY} if texts else None,
            "cores": os.cpu_count(),
            "rounds": rounds,
            "peers": list(peers),
        },
        "rows": rows,
        "summary": summary(rows),
    }


def row(peer: str, backend: str, concurrency: int, rnd: int, status: str, **metrics: Any) -> dict[str, Any]:
    out = {"peer": peer, "backend": backend, "concurrency": concurrency, "round": rnd, "status": status, **metrics}
    for key in (*FIGURES, "completed", "failed"):
        out.setdefault(key, math.nan)
    return out


def add_ratios(rows: list[dict[str, Any]]) -> None:
    """Each row's ratios to the vllm peer's row of the same round, backend and concurrency (NaN where either
    completed no request)."""
    key = ("round", "backend", "concurrency")
    for r in rows:
        ref = next((v for v in rows if v["peer"] == "vllm" and all(v[k] == r[k] for k in key)), None)
        for metric, name in RATIOS.items():
            ok = ref is not None and ref["completed"] > 0 and r["completed"] > 0 and ref[metric]
            r[name] = r[metric] / ref[metric] if ok else math.nan


def summary(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per peer, backend and concurrency: the median of each figure and each ratio over the rounds that completed
    requests (a run with some failed still counts; its failures are summed and its status kept)."""
    out = []
    for peer, backend, c in dict.fromkeys((r["peer"], r["backend"], r["concurrency"]) for r in rows):
        runs = [r for r in rows if (r["peer"], r["backend"], r["concurrency"]) == (peer, backend, c)]
        done = [r for r in runs if r["completed"] > 0]
        s = {"peer": peer, "backend": backend, "concurrency": c, "rounds": len(done), "of": len(runs)}
        s["failed"] = sum(r["failed"] for r in done)
        bad = sorted({r["status"] for r in runs} - {"ok"})
        s["status"] = "; ".join(bad)[:300] if bad else "ok"
        for metric in (*FIGURES, *RATIOS.values()):
            values = [r[metric] for r in done if not math.isnan(r[metric])]
            s[metric] = statistics.median(values) if values else math.nan
            if metric in RATIOS.values():
                s[f"{metric}_range"] = (min(values), max(values)) if values else None
        out.append(s)
    return out

"""The serving benchmark's client: ``vllm bench serve``'s arguments for a workload, run in a fresh subprocess per
measurement (``harness.vllm_bench``), and its JSON as this benchmark's row."""

from __future__ import annotations

import json
import math
import time
from pathlib import Path
from typing import Any

from harness.environment import last_error
from harness.vllm_bench import ClientFailed, bench_serve

from ..lib.peers import MODEL_NAME

BACKENDS = {"openai": "/v1/completions", "openai-chat": "/v1/chat/completions"}
INPUT_LEN, OUTPUT_LEN = 96, 64
RANGE_RATIO = {"input": 0.25, "output": 0.9}  # prompts 72-120 tokens, outputs 6-121 tokens: genuinely mixed
SLO_TPOT_MS = 400.0
WARMUPS = 8  # concurrent warm-up requests before each measurement (vllm bench serve --num-warmups)
METRICS = (
    "completed",
    "failed",
    "output_tok_s",
    "request_rps",
    "mean_output_len",
    "ttft_p50_ms",
    "ttft_p99_ms",
    "tpot_p50_ms",
    "tpot_p99_ms",
    "e2el_mean_ms",
    "e2el_p99_ms",
    "goodput_rps",
    "good",
    "streamed",
)


def client_argv(url: str, backend: str, folder: Path, prompts: int, rate: float, slo_ms: float | None) -> list[str]:
    argv = [
        "--backend",
        backend,
        "--base-url",
        url,
        "--endpoint",
        BACKENDS[backend],
        "--model",
        MODEL_NAME,
        "--served-model-name",
        MODEL_NAME,
        "--tokenizer",
        str(folder),
        "--dataset-name",
        "random",
        "--random-input-len",
        str(INPUT_LEN),
        "--random-output-len",
        str(OUTPUT_LEN),
        "--random-range-ratio",
        json.dumps(RANGE_RATIO),
        "--num-prompts",
        str(prompts),
        "--request-rate",
        "inf" if math.isinf(rate) else f"{rate:.4f}",
        "--seed",
        "0",
        "--temperature",
        "0",
        "--ignore-eos",
        "--ready-check-timeout-sec",
        "120",  # one test request first (0.32 skips it by default); the run stops if it fails
        "--num-warmups",
        str(WARMUPS),  # then the client's own warm-up, alike for every peer (a fresh server's first requests)
        "--percentile-metrics",
        "ttft,tpot,itl,e2el",
        "--metric-percentiles",
        "50,99",
        "--disable-tqdm",
        "--save-result",
        "--save-detailed",
    ]
    if slo_ms is not None:
        argv += ["--goodput", f"ttft:{slo_ms:g}", f"tpot:{SLO_TPOT_MS:g}"]
    return argv


def summarize(raw: dict[str, Any]) -> dict[str, Any]:
    """The client's JSON (saved with --save-detailed) as this benchmark's row fields."""
    completed = int(raw.get("completed") or 0)
    goodput = raw.get("request_goodput")
    ok = [i for i, e in enumerate(raw.get("errors") or []) if not e]
    lens = raw.get("output_lens") or []
    itls = raw.get("itls") or []
    multi = [i for i in ok if i < len(lens) and lens[i] > 1]
    errors = sorted({last_error(e) for e in raw.get("errors") or [] if e})
    return {
        "completed": completed,
        "failed": int(raw.get("failed") or 0),
        "output_tok_s": float(raw.get("output_throughput") or 0.0),
        "request_rps": float(raw.get("request_throughput") or 0.0),
        "mean_output_len": (raw.get("total_output_tokens") or 0) / completed if completed else math.nan,
        "ttft_p50_ms": raw.get("p50_ttft_ms", math.nan),
        "ttft_p99_ms": raw.get("p99_ttft_ms", math.nan),
        "tpot_p50_ms": raw.get("p50_tpot_ms", math.nan),
        "tpot_p99_ms": raw.get("p99_tpot_ms", math.nan),
        "itl_p50_ms": raw.get("p50_itl_ms", math.nan),
        "itl_p99_ms": raw.get("p99_itl_ms", math.nan),
        "e2el_mean_ms": raw.get("mean_e2el_ms", math.nan),
        "e2el_p99_ms": raw.get("p99_e2el_ms", math.nan),
        "goodput_rps": float(goodput) if goodput is not None else math.nan,
        "good": round(float(goodput) * float(raw["duration"])) if goodput is not None else math.nan,
        # Fraction of multi-token answers that arrived in more than one chunk: 0 means the server did not
        # stream (then TTFT is the whole latency).
        "streamed": sum(1 for i in multi if i < len(itls) and itls[i]) / len(multi) if multi else math.nan,
        "errors": errors[:5],
    }


def measure_one(url: str, backend: str, folder: Path, workdir: Path, prompts: int, rate: float, slo_ms, timeout_s):
    """One client run in its own subprocess (:func:`harness.vllm_bench.bench_serve`); returns (status, metrics)."""
    result = workdir / f"client-{time.monotonic_ns()}.json"
    try:
        raw = bench_serve(client_argv(url, backend, folder, prompts, rate, slo_ms), result, timeout_s)
    except ClientFailed as exc:
        return str(exc), {}
    metrics = summarize(raw)
    status = "ok" if metrics["failed"] == 0 else f"{metrics['failed']} failed: {'; '.join(metrics['errors'])[:300]}"
    return status, metrics


def blank(peer: str, backend: str, workload: str, status: str, rnd: int = 0, **extra: Any) -> dict[str, Any]:
    row: dict[str, Any] = {"peer": peer, "backend": backend, "workload": workload, "status": status, "round": rnd}
    row.update(extra)
    for key in METRICS:
        row.setdefault(key, math.nan)
    row.setdefault("errors", [])
    return row

"""The embeddings benchmark's runs: every peer in turn, and one peer's measurement (start it, warm it up, run each
scenario under the closed loop and read the batches it ran and the CPU that other processes took meanwhile, running a
disturbed run again)."""

import asyncio
import math
import os
import re
import sys
import tempfile
import time
from contextlib import suppress
from pathlib import Path
from typing import Any

from harness.environment import tail
from harness.procs import own_leftovers

from ..padding import make_texts
from .apps import NAIVE_BATCH, NAIVE_WAIT_S
from .load import (
    MIN_COSINE,
    REQUESTS_PER_CLIENT,
    SCENARIOS,
    load,
    min_cosine,
    reference_vectors,
    request_chunks,
    sample_indices,
)
from .peers import MODEL_NAME, PEERS, app_args, app_dtype, cores, get_json, running
from .summary import summarize, token_lengths

WARM_TEXTS_PER_CLIENT = 4  # a peer's warm-up: this many texts per client, at the full client count
QUIET_CORES = 0.25  # a run during which other processes used more CPU than this is run again (``--retries``)
RETRY_PAUSE_S = 20.0


def cpu_times(marker: str) -> tuple[int, int]:
    """(CPU ticks the machine was busy, CPU ticks of this process and the peer's processes), for
    :func:`other_cpu`."""
    with open("/proc/stat") as fh:
        ticks = [int(x) for x in fh.readline().split()[1:9]]
    busy = sum(ticks) - ticks[3] - ticks[4]  # all but idle and iowait
    mine = 0
    for pid in [os.getpid(), *own_leftovers(marker)]:
        with suppress(OSError, ValueError, IndexError):
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            mine += int(fields[11]) + int(fields[12])  # utime, stime
    return busy, mine


def other_cpu(before: tuple[int, int], after: tuple[int, int], wall_s: float) -> float:
    """Cores' worth of CPU that other processes (not this benchmark, not the peer) used during a run: the
    machine is shared, and this says how much a figure may have lost to others."""
    others = (after[0] - before[0]) - (after[1] - before[1])
    return max(0.0, others / os.sysconf("SC_CLK_TCK") / wall_s) if wall_s > 0 else math.nan


def served_dtype(peer: str, url: str, log: str) -> str:
    """What a running peer computes in: vLLM's server names it in its log, the Ray peers in ``/stats``."""
    if peer.startswith("vllm"):
        found = re.search(r"dtype=torch\.(\w+)", log)
        return found.group(1) if found else "?"
    return str((get_json(f"{url}/stats") or {}).get("dtype", "?"))


def engine_counts(url: str) -> dict[str, float] | None:
    stats = get_json(f"{url}/stats")
    return (stats or {}).get("engine_stats")


def waste_between(before: dict[str, float] | None, after: dict[str, float] | None) -> tuple[float, float]:
    """(padding waste, mean batch size) of the batches run between two stats reads; NaN when unknown (an engine
    that packs inputs, vLLM's, pads nothing and has no batches of its own to count)."""
    if not before or not after:
        return math.nan, math.nan
    if "padded_tokens" not in after:
        return 0.0, math.nan
    padded = after["padded_tokens"] - before["padded_tokens"]
    batches = after["batches"] - before["batches"]
    waste = 1 - (after["tokens"] - before["tokens"]) / padded if padded else math.nan
    return waste, (after["inputs"] - before["inputs"]) / batches if batches else math.nan


def one_run(
    peer: str,
    url: str,
    marker: str,
    texts: list[str],
    scenario: str,
    clients: int,
    reference: dict[int, list[float]],
    timeout_s: float,
) -> dict[str, Any]:
    """One scenario against a running peer: its row (throughput, latency, padding, vectors, others' CPU)."""
    before = engine_counts(url)
    cpu = cpu_times(marker)
    out = asyncio.run(load(url, texts, SCENARIOS[scenario], clients, set(reference), timeout_s))
    out["other_cpu"] = other_cpu(cpu, cpu_times(marker), out["wall_s"])
    waste, batch = waste_between(before, engine_counts(url))
    cosine = min_cosine(out.pop("vectors"), reference)
    status = "ok" if not out["failed"] else f"{out['failed']} failed: {'; '.join(out['errors'])}"
    if not cosine >= MIN_COSINE:
        status = f"WRONG VECTORS (min cosine {cosine:.4f})" + ("" if status == "ok" else f"; {status}")
    row = {
        "peer": peer,
        "scenario": scenario,
        "status": status,
        "padding_waste": 0.0 if peer.startswith("vllm") else waste,
        "avg_batch": batch,
        "min_cosine": cosine,
        **out,
    }
    print(
        f"[embeddings] {peer} {scenario}: {row['texts_per_s']:.1f} texts/s, p50 {row['p50_ms']:.0f} ms, p99 "
        f"{row['p99_ms']:.0f} ms, waste {waste:.2f}, cos {cosine:.5f}, others used {row['other_cpu']:.2f} cores, "
        f"{status}",
        file=sys.stderr,
        flush=True,
    )
    return row


def measure_peer(
    peer: str,
    workdir: Path,
    texts: list[str],
    scenarios: list[str],
    clients: int,
    repeats: int,
    reference: dict[int, list[float]],
    timeout_s: float,
    app_batcher: dict[str, Any] | None = None,
    retries: int = 2,
) -> list[dict[str, Any]]:
    """Start one peer, warm it up, run every scenario ``repeats`` times, stop it; one row per run."""
    rows: list[dict[str, Any]] = []
    print(f"[embeddings] starting {peer}", file=sys.stderr, flush=True)
    try:
        with running(peer, workdir, 600, app_batcher) as (url, startup_s, marker):
            dtype = served_dtype(peer, url, tail(workdir / f"{peer}.log", 200_000))
            print(f"[embeddings] {peer} ready in {startup_s:.0f} s, in {dtype}", file=sys.stderr, flush=True)
            # Warmed at the measured load, so that the clock starts on a server that has already run steps as
            # large as the load's (16 clients made smaller ones).
            warm = make_texts(WARM_TEXTS_PER_CLIENT * clients, seed=1)
            for per_request in sorted({SCENARIOS[s] for s in scenarios}):
                asyncio.run(load(url, warm, per_request, clients, set(), timeout_s, per_client=1))
            for repeat in range(repeats):
                for scenario in scenarios:
                    # A run that others disturbed (the machine is shared) is run again after a pause, at most
                    # ``retries`` times; the least disturbed attempt is kept (never the fastest: no bias).
                    attempts: list[dict[str, Any]] = []
                    while True:
                        attempts.append(one_run(peer, url, marker, texts, scenario, clients, reference, timeout_s))
                        if attempts[-1]["other_cpu"] <= QUIET_CORES or len(attempts) > retries:
                            break
                        time.sleep(RETRY_PAUSE_S)
                    row = min(attempts, key=lambda r: r["other_cpu"])
                    row.update(repeat=repeat, startup_s=startup_s, attempts=len(attempts), dtype=dtype)
                    rows.append(row)
    except RuntimeError as exc:
        print(f"[embeddings] {peer} did not deploy: {exc}", file=sys.stderr, flush=True)
        for scenario in scenarios:
            rows.append({"peer": peer, "scenario": scenario, "repeat": 0, "status": f"did not deploy: {exc}"})
    return rows


def cpu_model() -> str:
    """This CPU's model name as /proc/cpuinfo gives it, with its bfloat16 units (what ``dtype: auto`` reads)."""
    from serve_app.engines.cpu import NATIVE_BF16_FLAGS, cpu_flags, cpuinfo_field

    units = sorted(NATIVE_BF16_FLAGS & cpu_flags())
    return f"{cpuinfo_field('model name') or 'an unnamed CPU'} ({', '.join(units) or 'no bfloat16 units'})"


def measure(
    quick: bool = False,
    peers: tuple[str, ...] = PEERS,
    scenarios: tuple[str, ...] = tuple(SCENARIOS),
    n_texts: int | None = None,
    clients: int | None = None,
    repeats: int | None = None,
    rounds: int = 1,
    app_batcher: dict[str, Any] | None = None,
    retries: int = 2,
) -> dict[str, Any]:
    """Every peer in turn, ``rounds`` times (peers interleaved); ``{"config", "rows", "runs"}``. Never raises
    for a peer that fails: its rows say why."""
    n_texts = n_texts or (200 if quick else 1000)
    clients = clients or (32 if quick else 64)
    repeats = repeats or 1
    texts = make_texts(n_texts)
    indices = sample_indices(texts)
    reference = reference_vectors(texts, indices)
    timeout_s = 900.0
    runs: list[dict[str, Any]] = []
    started = time.time()
    with tempfile.TemporaryDirectory(prefix="embeddings-bench-") as tmp:
        for round_ in range(rounds):
            for peer in peers:
                workdir = Path(tmp) / f"{peer}-{round_}"
                workdir.mkdir()
                runs += measure_peer(
                    peer, workdir, texts, list(scenarios), clients, repeats, reference, timeout_s, app_batcher, retries
                )
    from serve_app.config import EmbeddingConfig

    return {
        "config": {
            "model": MODEL_NAME,
            "app_dtype": app_dtype(),
            "texts": n_texts,
            "clients": clients,
            "requests_per_client": REQUESTS_PER_CLIENT,
            "texts_sent": {
                s: sum(map(len, request_chunks(n_texts, SCENARIOS[s], clients, REQUESTS_PER_CLIENT))) for s in scenarios
            },
            "repeats": repeats,
            "rounds": rounds,
            "retries": retries,
            "quiet_cores": QUIET_CORES,
            "scenarios": {s: SCENARIOS[s] for s in scenarios},
            "sampled_vectors": len(indices),
            "cores": cores(),
            "cpu": cpu_model(),
            "app_batcher": EmbeddingConfig.model_validate(app_args({"batcher": app_batcher})).batcher.model_dump(),
            "naive": {"max_batch_size": NAIVE_BATCH, "batch_wait_timeout_s": NAIVE_WAIT_S},
            "token_lengths": token_lengths(texts),
            "load_average_at_start": os.getloadavg()[0],
            "minutes": (time.time() - started) / 60,
        },
        "rows": summarize(runs, list(peers), list(scenarios)),
        "runs": runs,
    }

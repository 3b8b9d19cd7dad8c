"""A SIMULATED GPU: the simulated engine with a cost model fitted to the seeds' figures for an 8B model on
an A100 (about 30 output tokens/s at batch 1, 300 at 16, 900 at 64), under open-loop Poisson arrivals.

A decode step of a batch of ``b`` sequences takes ``32.7 ms + 0.6 ms * b`` (a straight line through the
seeds' points at 1 and 64: 30 tokens/s at 1, 375 at 16, 897 at 64), every request asks for 128 new
tokens, and prompts are 32-512 tokens. A batch's token cost (prompt + 128) must fit a KV-cache budget of
16,384 tokens: a batch over it would not fit on the GPU, so batches over budget are counted.

Peers, fed the same arrivals in the same process: ours (``TokenBatcher``), the reference
(``flyte.extras.TokenBatcher``) and ``@serve.batch`` (with ``batch_size_fn`` summing tokens). Time runs
``--time-scale`` times faster than the simulated GPU's (all figures are reported in simulated seconds).

    python -m benchmarks.simulated --rates 2 4 6 8 --requests 400
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from serve_app.config import SimulatedSettings
from serve_app.engines import GenerationRequest, SamplingOptions
from serve_app.engines.simulated import SimulatedEngine

from .overhead import _serve_batch_outside_a_replica

STEP_S, STEP_S_PER_SEQ = 0.0327, 0.0006
KV_BUDGET = 16_384
MAX_TOKENS = 128
MAX_BATCH = 64
TIMEOUT_S = 0.05


class Meter:
    """Wraps the engine: counts busy time, batches over the KV budget, and batch sizes."""

    def __init__(self, engine: SimulatedEngine) -> None:
        self.engine = engine
        self.busy = 0.0
        self.over_budget = 0
        self.sizes: list[int] = []

    async def __call__(self, batch: list[GenerationRequest]) -> list[Any]:
        self.sizes.append(len(batch))
        if len(batch) > 1 and sum(r.estimate_tokens() for r in batch) > KV_BUDGET:
            self.over_budget += 1
        started = time.perf_counter()
        results = await self.engine.generate(batch)
        self.busy += time.perf_counter() - started
        return results


def workload(n: int, rate: float, scale: float, seed: int) -> list[tuple[float, GenerationRequest]]:
    """``n`` requests with Poisson arrival times (real seconds) at ``rate`` requests per simulated second."""
    rng = random.Random(seed)
    t = 0.0
    out = []
    for i in range(n):
        t += rng.expovariate(rate) * scale
        prompt = [1] * rng.randint(32, 512)
        out.append((t, GenerationRequest(f"r{i}", prompt, SamplingOptions(max_tokens=MAX_TOKENS))))
    return out


async def drive(submit: Any, arrivals: list[tuple[float, GenerationRequest]]) -> tuple[float, list[float]]:
    """Open loop: each request is sent at its arrival time whatever came back; returns (span, latencies)."""
    latencies: list[float] = []
    start = time.perf_counter()

    async def one(at: float, request: GenerationRequest) -> None:
        await asyncio.sleep(max(0.0, start + at - time.perf_counter()))
        sent = time.perf_counter()
        await submit(request)
        latencies.append(time.perf_counter() - sent)

    await asyncio.gather(*(one(at, r) for at, r in arrivals))
    return time.perf_counter() - start, latencies


async def run_peer(peer: str, arrivals: list[tuple[float, GenerationRequest]], scale: float) -> dict[str, Any]:
    engine = SimulatedEngine(
        SimulatedSettings(
            step_s=STEP_S * scale,
            step_s_per_seq=STEP_S_PER_SEQ * scale,
            fail_marker=None,
            die_marker=None,
            raise_marker=None,
        )
    )
    meter = Meter(engine)
    knobs = {"max_batch_size": MAX_BATCH, "batch_timeout_s": TIMEOUT_S * scale, "max_queue_size": 100_000}
    if peer == "serve.batch":
        serve = _serve_batch_outside_a_replica()

        class Model:
            @serve.batch(
                max_batch_size=KV_BUDGET,
                batch_wait_timeout_s=TIMEOUT_S * scale,
                batch_size_fn=lambda items: sum(r.estimate_tokens() for r in items),
            )
            async def __call__(self, batch: list[GenerationRequest]) -> list[Any]:
                return await meter(batch)

        model = Model()
        span, lat = await drive(model, arrivals)
    else:
        if peer == "ours":
            from batching import TokenBatcher
        else:
            from flyte.extras import TokenBatcher
        async with TokenBatcher(inference_fn=meter, target_batch_tokens=KV_BUDGET, **knobs) as batcher:

            async def submit(request: GenerationRequest) -> Any:
                return await (await batcher.submit(request))

            span, lat = await drive(submit, arrivals)
    lat.sort()
    return {
        "peer": peer,
        "output_tokens_per_s": len(arrivals) * MAX_TOKENS / (span / scale),
        "utilization": meter.busy / span,
        "p50_s": lat[len(lat) // 2] / scale,
        "p99_s": lat[min(len(lat) - 1, int(len(lat) * 0.99))] / scale,
        "avg_batch": statistics.fmean(meter.sizes),
        "batches_over_budget": meter.over_budget,
    }


def measure(rates: list[float], n: int, repeats: int, scale: float, peers: list[str]) -> list[dict[str, Any]]:
    """Every (rate, peer) ``repeats`` times with the same arrivals per repeat, interleaved; medians."""
    runs: dict[tuple[float, str], list[dict[str, Any]]] = {}
    for rep in range(repeats):
        for rate in rates:
            arrivals = workload(n, rate, scale, seed=rep)
            for peer in peers:
                runs.setdefault((rate, peer), []).append(asyncio.run(run_peer(peer, arrivals, scale)))
    rows = []
    for (rate, peer), samples in runs.items():
        row: dict[str, Any] = {"rate_rps": rate, "peer": peer, "runs": len(samples)}
        for key in ("output_tokens_per_s", "utilization", "p50_s", "p99_s", "avg_batch", "batches_over_budget"):
            row[key] = statistics.median(s[key] for s in samples)
        rows.append(row)
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rates", type=float, nargs="+", default=[2, 4, 6, 8], help="requests per simulated second")
    parser.add_argument("--requests", type=int, default=400)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--time-scale", type=float, default=0.02)
    parser.add_argument("--peers", nargs="+", default=["ours", "reference", "serve.batch"])
    parser.add_argument("--json")
    args = parser.parse_args(argv)
    rows = measure(args.rates, args.requests, args.repeats, args.time_scale, args.peers)
    for r in rows:
        print(
            f"rate {r['rate_rps']:>4} {r['peer']:<12} {r['output_tokens_per_s']:7.0f} tok/s "
            f"util {r['utilization']:.2f} p50 {r['p50_s']:6.1f}s p99 {r['p99_s']:6.1f}s "
            f"batch {r['avg_batch']:5.1f} over-budget {r['batches_over_budget']}"
        )
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Batcher overhead: records/s and added latency with a no-op process_fn, ours against the peers.

Peers, all in this one process and run interleaved so machine noise hits each alike:
  - ours: ``batching.DynamicBatcher``
  - reference: ``flyte.extras.DynamicBatcher`` (flyte==2.12.1, a benchmark-only dependency)
  - serve.batch: Ray Serve's ``@serve.batch`` with ``batch_size_fn`` as the token budget

Each producer submits its share of the records, then awaits all its results (the seeds' pattern). With
``@serve.batch`` a caller awaits each call, so a producer runs its calls as concurrent tasks.

Before each run the harness collects and freezes the garbage collector's heap (``gc.freeze()``, as
long-running servers do after start-up): importing Ray and the reference leaves about 160,000 tracked
objects; without freezing, every full collection walks them all, a tax that falls hardest on whichever
peer allocates fastest.

    python -m benchmarks.overhead --records 200000 --producers 1 16 256 --repeats 5
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import statistics
import sys
import time
from collections.abc import Callable, Coroutine
from typing import Any

BATCH = {"target_batch_cost": 32_000, "max_batch_size": 256, "batch_timeout_s": 0.05}
SAMPLE_MASK = 15  # latency is sampled on one record in 16, to keep the harness light
QUEUE = 5_000  # the default max_queue_size: producers feel backpressure


async def _noop(batch: list[Any]) -> list[float]:
    """No work; each result is the time its batch finished, so latency costs the harness nothing extra."""
    done = time.perf_counter()
    return [done] * len(batch)


def _producer_shares(records: int, producers: int) -> list[range]:
    step = -(-records // producers)
    return [range(i, min(records, i + step)) for i in range(0, records, step)]


async def _drive_submitter(batcher: Any, records: int, producers: int) -> tuple[float, list[float]]:
    """Each producer awaits ``submit(x)`` for its share, then gathers; returns (seconds, latencies)."""
    latencies: list[float] = []
    clock = time.perf_counter

    async def produce(share: range) -> None:
        futures = []
        sent = []
        for i in share:
            if i & SAMPLE_MASK == 0:
                sent.append((len(futures), clock()))
            futures.append(await batcher.submit(i, estimated_cost=1))
        done = await asyncio.gather(*futures)
        latencies.extend(done[k] - t for k, t in sent)

    start = time.perf_counter()
    await asyncio.gather(*(produce(share) for share in _producer_shares(records, producers)))
    return time.perf_counter() - start, latencies


async def run_ours(records: int, producers: int) -> tuple[float, list[float]]:
    from batching import DynamicBatcher

    async with DynamicBatcher(_noop, max_queue_size=QUEUE, **BATCH) as batcher:
        return await _drive_submitter(batcher, records, producers)


async def run_reference(records: int, producers: int) -> tuple[float, list[float]]:
    from flyte.extras import DynamicBatcher

    async with DynamicBatcher(_noop, max_queue_size=QUEUE, **BATCH) as batcher:
        return await _drive_submitter(batcher, records, producers)


def _serve_batch_outside_a_replica() -> Any:
    """``@serve.batch`` reads ``max_ongoing_requests`` from the replica context; outside a replica, give it
    a stub context (with no bound) so the benchmark measures the batching queue alone, not Ray's RPCs."""
    from types import SimpleNamespace

    from ray import serve

    stub = SimpleNamespace(_deployment_config=SimpleNamespace(max_ongoing_requests=10**9))
    serve.get_replica_context = lambda: stub
    return serve


async def run_serve_batch(records: int, producers: int) -> tuple[float, list[float]]:
    serve = _serve_batch_outside_a_replica()

    class Model:
        @serve.batch(
            max_batch_size=BATCH["max_batch_size"],
            batch_wait_timeout_s=BATCH["batch_timeout_s"],
            batch_size_fn=lambda items: len(items),  # one token per record: the same budget as the others
        )
        async def __call__(self, items: list[int]) -> list[float]:
            return await _noop(items)

    model = Model()
    latencies: list[float] = []
    clock = time.perf_counter

    async def one(i: int) -> None:
        if i & SAMPLE_MASK:
            await model(i)
        else:
            sent = clock()
            latencies.append(await model(i) - sent)

    async def produce(share: range) -> None:
        await asyncio.gather(*(one(i) for i in share))

    start = time.perf_counter()
    await asyncio.gather(*(produce(share) for share in _producer_shares(records, producers)))
    return time.perf_counter() - start, latencies


class _Floor:
    """Not a batcher: the least any asyncio batcher returning one future per record can do (create the
    future, resolve it in chunks of 256). Its rate is the ceiling of this usage pattern on this machine."""

    def __init__(self) -> None:
        self.pending: list[asyncio.Future] = []
        self.loop = asyncio.get_running_loop()

    async def submit(self, record: int, estimated_cost: int = 1) -> asyncio.Future:
        future = self.loop.create_future()
        self.pending.append(future)
        if len(self.pending) >= BATCH["max_batch_size"]:
            self.flush()
        return future

    def flush(self) -> None:
        batch, self.pending = self.pending, []
        done = time.perf_counter()
        for future in batch:
            future.set_result(done)

    async def tick(self) -> None:
        while True:
            await asyncio.sleep(0.001)
            if self.pending:
                self.flush()


async def run_floor(records: int, producers: int) -> tuple[float, list[float]]:
    floor = _Floor()
    ticker = asyncio.ensure_future(floor.tick())
    try:
        return await _drive_submitter(floor, records, producers)
    finally:
        ticker.cancel()


PEERS: dict[str, Callable[[int, int], Coroutine[Any, Any, tuple[float, list[float]]]]] = {
    "ours": run_ours,
    "reference": run_reference,
    "serve.batch": run_serve_batch,
    "asyncio floor": run_floor,
}


def measure(records: int, producers_list: list[int], repeats: int, peers: list[str]) -> list[dict[str, Any]]:
    """Run every (producers, peer) cell ``repeats`` times, interleaved; return one row per cell (medians)."""
    runs: dict[tuple[int, str], list[tuple[float, float, float]]] = {}
    for _ in range(repeats):
        for producers in producers_list:
            for peer in peers:
                gc.collect()
                gc.freeze()
                try:
                    seconds, lat = asyncio.run(PEERS[peer](records, producers))
                finally:
                    gc.unfreeze()
                lat.sort()
                p50 = lat[len(lat) // 2]
                p99 = lat[min(len(lat) - 1, int(len(lat) * 0.99))]
                runs.setdefault((producers, peer), []).append((records / seconds, p50, p99))
    rows = []
    for (producers, peer), samples in runs.items():
        rows.append(
            {
                "producers": producers,
                "peer": peer,
                "records_per_s": statistics.median(s[0] for s in samples),
                "p50_ms": statistics.median(s[1] for s in samples) * 1e3,
                "p99_ms": statistics.median(s[2] for s in samples) * 1e3,
                "runs": len(samples),
            }
        )
    for row in rows:
        ours = next(r for r in rows if r["producers"] == row["producers"] and r["peer"] == "ours")
        row["ours_speedup"] = ours["records_per_s"] / row["records_per_s"]
        floor = next((r for r in rows if r["producers"] == row["producers"] and r["peer"] == "asyncio floor"), None)
        # What the batcher itself costs per record, above the floor of the usage pattern.
        row["added_us"] = 1e6 / row["records_per_s"] - 1e6 / floor["records_per_s"] if floor else float("nan")
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=100_000)
    parser.add_argument("--producers", type=int, nargs="+", default=[1, 16, 256])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--peers", nargs="+", default=list(PEERS), choices=list(PEERS))
    parser.add_argument("--json", help="write the rows to this file")
    args = parser.parse_args(argv)
    rows = measure(args.records, args.producers, args.repeats, args.peers)
    for row in rows:
        print(
            f"producers={row['producers']:>4} {row['peer']:<12} {row['records_per_s']:>12,.0f} rec/s "
            f"p50={row['p50_ms']:8.2f}ms p99={row['p99_ms']:8.2f}ms  ours x{row['ours_speedup']:.1f}"
        )
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(rows, fh, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())

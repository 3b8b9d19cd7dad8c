"""Admission without Ray: the mixed-length burst into one in-process ``AsyncLLM``, all at once or through the
app's continuous batcher, with every engine step counted.

It separates what admission does to vLLM's schedule from what Ray costs: no replica, no proxy, no handle,
the same engine, requests and batcher settings as ``benchmarks.e2e``'s burst. Modes (rotated each round):

  direct        every request straight into ``AsyncLLM`` at once (``burst-direct`` of ``benchmarks.e2e``)
  admitted-K    through ``ContinuousBatcher`` with serve_config.yaml's batcher settings and at most K in
                flight (``auto``: what the app's ``max_inflight: auto`` gives for this engine)

An engine step is one batch of outputs from vLLM's engine core (the benchmark wraps its
``get_output_async``); ``seqs_per_step`` is how many requests produced a token in it, and
``seqs_per_step_while_queued`` its mean while requests were still waiting (vLLM's running cap is the most
it can be: below it, freed places waited for their next request). Wall-clock figures on a shared 2-core
machine move by +-15% between runs; the step counts do not.

    python -m benchmarks.admission_trace --inflight auto 144 --rounds 2
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import time
from typing import Any

from batching import ContinuousBatcher
from serve_app.config import ContinuousSettings
from serve_app.engines import GenerationRequest, SamplingOptions
from serve_app.engines.async_llm import llm_kv_cache_tokens, llm_max_running

from .e2e.direct import Direct
from .e2e.settings import app_args, burst_requests
from .lib.report import table


class StepCounter:
    """Counts the engine core's output batches (one per engine step) and the requests in each."""

    def __init__(self, direct: Direct) -> None:
        core = direct.llm.engine_core
        original = core.get_output_async
        self.steps: list[int] = []

        async def counted() -> Any:
            outputs = await original()
            if outputs.outputs:
                self.steps.append(len(outputs.outputs))
            return outputs

        core.get_output_async = counted


def batcher_kwargs(direct: Direct, running_cap: int, inflight: str) -> dict[str, Any]:
    """serve_config.yaml's batcher settings for this engine, with ``max_inflight`` set to ``inflight``."""
    settings = ContinuousSettings.model_validate({**app_args()["batcher"], "max_inflight": inflight})
    return settings.batcher_kwargs(llm_kv_cache_tokens(direct.llm), running_cap)


Outcome = tuple[float, int]
"""(latency s, output tokens) of one request."""


async def burst(direct: Direct, requests: list[tuple[str, int]], kwargs: dict[str, Any] | None) -> list[Outcome]:
    """Each request's outcome, all sent at once: straight in (``kwargs`` None) or through a batcher."""
    if kwargs is None:
        started = time.perf_counter()

        async def straight(text: str, max_tokens: int) -> Outcome:
            _, tokens = await direct.one(text, max_tokens)
            return time.perf_counter() - started, tokens

        return list(await asyncio.gather(*(straight(t, m) for t, m in requests)))

    async def process(request: GenerationRequest):
        _, tokens = await direct.one(request.prompt_text, request.sampling.max_tokens)
        yield tokens

    async def admitted(batcher: ContinuousBatcher, request: GenerationRequest) -> Outcome:
        tokens = await (await batcher.submit(request))
        return time.perf_counter() - started, tokens

    # Token counts for the batcher's costs, before the clock starts (direct.one tokenizes again, as in direct)
    records = [
        GenerationRequest(f"r{i}", direct.tokenizer.encode(t), SamplingOptions(max_tokens=m), prompt_text=t)
        for i, (t, m) in enumerate(requests)
    ]
    async with ContinuousBatcher(process, **kwargs) as batcher:
        started = time.perf_counter()
        return list(await asyncio.gather(*(admitted(batcher, r) for r in records)))


def row(mode: str, outcomes: list[Outcome], steps: list[int], running_cap: int) -> dict[str, Any]:
    """One burst's figures. "While queued": from the first step at vLLM's running cap to the last one
    within 90% of it, after which the requests still running drain without successors."""
    latencies = [latency for latency, _ in outcomes]
    wall = max(latencies)
    tokens = sum(n for _, n in outcomes)
    near_cap = [i for i, n in enumerate(steps) if n >= 0.9 * running_cap]
    first_full = next((i for i, n in enumerate(steps) if n >= running_cap), None)
    queued = steps[first_full : near_cap[-1] + 1] if first_full is not None else []
    return {
        "mode": mode,
        "output_tokens": tokens,
        "wall_s": round(wall, 1),
        "output_tokens_per_s": round(tokens / wall, 1),
        "mean_latency_s": round(statistics.fmean(latencies), 1),
        "engine_steps": len(steps),
        "seqs_per_step": round(statistics.fmean(steps), 1),
        "seqs_per_step_while_queued": round(statistics.fmean(queued), 1) if queued else None,
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--burst", type=int, default=256)
    parser.add_argument("--inflight", nargs="+", default=["auto"], help="max_inflight values to compare")
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--json", help="write every run's row here")
    args = parser.parse_args(argv)

    requests = burst_requests(args.burst)
    direct = Direct()
    counter = StepCounter(direct)
    running_cap = llm_max_running(direct.llm)
    modes: list[tuple[str, dict[str, Any] | None]] = [("direct", None)]
    for value in args.inflight:
        kwargs = batcher_kwargs(direct, running_cap, value)
        modes.append((f"admitted-{kwargs['max_inflight']}" + (" (auto)" if value == "auto" else ""), kwargs))

    async def run() -> list[dict[str, Any]]:
        await burst(direct, requests[:2], None)  # warm up
        rows = []
        for index in range(args.rounds):
            for mode, kwargs in modes[index % len(modes) :] + modes[: index % len(modes)]:
                counter.steps.clear()
                outcomes = await burst(direct, requests, kwargs)
                rows.append({"round": index, **row(mode, outcomes, list(counter.steps), running_cap)})
                print(json.dumps(rows[-1]), file=sys.stderr, flush=True)
        return rows

    try:
        rows = asyncio.run(run())
    finally:
        direct.shutdown()
    print(table(rows, [(key, key, "") for key in rows[0]]))
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(rows, fh, indent=1)


if __name__ == "__main__":
    main()

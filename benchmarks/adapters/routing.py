"""The token router's adapter score on a SIMULATED fleet: 4 replicas on a local 4-node Ray cluster (the routing
benchmark's, :mod:`benchmarks.routing.cluster`), each engine holding at most 2 of 4 LoRA adapters and taking
``LOAD_S`` longer for a step that loads one (the simulated engine's ``adapter_load_s``; what a GPU pays to bring an
adapter into its slots). Closed-loop clients through ``DeploymentHandle`` calls (this process routes them), each
request naming an adapter drawn Zipf-skewed (weights 1, 1/2, 1/3, 1/4); the same seeded draws for every weight.

    python -m benchmarks.adapters routing [--rounds 2] [--seconds 30] [--weights 0 2000 4000 8000]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import statistics
import sys
import time
from typing import Any

from ..lib.report import RESULTS, stamp, table
from ..routing.cluster import ENGINE, REPLICAS, in_rounds, per_replica

ADAPTERS = ("w", "x", "y", "z")
MAX_LOADED = 2
LOAD_S = 0.1
CLIENTS = 96
MAX_TOKENS = 64


def app_args(weight: float) -> dict[str, Any]:
    """The app: the routing benchmark's simulated fleet, serving the four adapters (each the bundled one)."""
    return {
        **ENGINE,
        "simulated": {**ENGINE["simulated"], "adapter_load_s": LOAD_S},
        "lora": {"adapters": dict.fromkeys(ADAPTERS, "bundled"), "max_loaded": MAX_LOADED},
        "routing": {"router": "tokens", "adapter_weight": weight},
    }


def draws(count: int, seed: int) -> list[str]:
    rng = random.Random(seed)
    return rng.choices(ADAPTERS, weights=[1 / (k + 1) for k in range(len(ADAPTERS))], k=count)


async def run_once(weight: float, seconds: float, seed: int) -> dict[str, Any]:
    """Deploy the app with ``weight``, run the clients for ``seconds``, delete it; what was measured."""
    from ray import serve

    from serve_app.app import build_app

    app = f"adapters-{int(weight)}"
    handle = await asyncio.to_thread(serve.run, build_app(app_args(weight)), name=app, route_prefix=f"/{app}")
    before = await per_replica(handle, REPLICAS)
    models = iter(draws(100_000, seed))
    ttfts: list[float] = []
    tokens, errors, wrong = 0, [], 0
    start = time.monotonic()

    async def client(k: int) -> None:
        nonlocal tokens, wrong
        while time.monotonic() - start < seconds:
            model, sent, first = next(models), time.monotonic(), None
            try:
                call = handle.options(stream=True).generate_stream.remote(
                    f"client {k} asks " + "about adapters " * 20, max_tokens=MAX_TOKENS, model=model
                )
                async for item in call:
                    first = first or time.monotonic()
                    if item["type"] == "result":
                        tokens += item["output_tokens"]
                        wrong += not item["text"].startswith(f"[simulated {model}]")
                ttfts.append(first - sent)  # type: ignore[operator]
            except Exception as exc:
                errors.append(repr(exc)[:200])

    await asyncio.gather(*(client(k) for k in range(CLIENTS)))
    elapsed = time.monotonic() - start
    after = await per_replica(handle, REPLICAS)
    await asyncio.to_thread(serve.delete, app)
    loads = sum(
        s["engine_stats"]["adapter_loads"]
        - before.get(rid, {"engine_stats": {"adapter_loads": 0}})["engine_stats"]["adapter_loads"]
        for rid, s in after.items()
    )
    ttfts.sort()
    return {
        "weight": weight,
        "tok_s": tokens / elapsed,
        "ttft_p50_s": statistics.median(ttfts),
        "ttft_p99_s": ttfts[int(0.99 * (len(ttfts) - 1))],
        "loads_per_min": loads * 60 / elapsed,
        "requests": len(ttfts),
        "wrong_adapter": wrong,
        "errors": errors[:5],
    }


async def measure(weights: list[float], rounds: int, seconds: float, seed: int = 11) -> list[dict[str, Any]]:
    """Every weight in every round (order reversed in odd rounds), on one cluster."""
    shown = ("weight", "tok_s", "loads_per_min", "ttft_p99_s")
    return await in_rounds(weights, rounds, lambda weight: run_once(weight, seconds, seed), shown)


COLUMNS = [
    ("weight", "adapter_weight", ",.0f"),
    ("rounds", "rounds", ""),
    ("tok_s", "output tok/s", ",.0f"),
    ("vs_none", "x no score", ".2f"),
    ("ttft_p50_s", "TTFT p50 s", ".3f"),
    ("ttft_p99_s", "TTFT p99 s", ".3f"),
    ("loads_per_min", "adapter loads / min", ",.0f"),
    ("loads_vs_none", "loads x no score", ".2f"),
    ("wrong_adapter", "answers from another adapter", ""),
]


def summary(runs: list[dict[str, Any]], weights: list[float]) -> list[dict[str, Any]]:
    """Medians over the rounds per weight, and the medians of the per-round ratios to no adapter score (weight 0)."""
    rows = []
    for weight in weights:
        mine = [r for r in runs if r["weight"] == weight]
        base = {r["round"]: r for r in runs if r["weight"] == 0}
        row: dict[str, Any] = {"weight": weight, "rounds": len(mine)}
        for key in ("tok_s", "ttft_p50_s", "ttft_p99_s", "loads_per_min"):
            row[key] = statistics.median(r[key] for r in mine)
        if base:
            row["vs_none"] = statistics.median(r["tok_s"] / base[r["round"]]["tok_s"] for r in mine)
            row["loads_vs_none"] = statistics.median(
                r["loads_per_min"] / max(base[r["round"]]["loads_per_min"], 1e-9) for r in mine
            )
        row["wrong_adapter"] = sum(r["wrong_adapter"] for r in mine)
        rows.append(row)
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.adapters routing", description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--seconds", type=float, default=30.0)
    parser.add_argument("--weights", type=float, nargs="+", default=[0.0, 2_000.0, 4_000.0, 8_000.0])
    args = parser.parse_args(argv)
    weights = sorted(set([0.0, *args.weights]))
    started = time.time()
    runs = asyncio.run(measure(weights, args.rounds, args.seconds))
    rows = summary(runs, weights)
    errors = [e for r in runs for e in r["errors"]]
    page = (
        "### The adapter score on a simulated fleet\n\n"
        f"{REPLICAS} simulated replicas on a local {REPLICAS}-node Ray cluster (the routing benchmark's engine), "
        f"{len(ADAPTERS)} LoRA adapters, at most {MAX_LOADED} held per engine (a step that loads one takes "
        f"{LOAD_S:g} s longer); {CLIENTS} closed-loop clients for {args.seconds:g} s, each request streamed with "
        f"{MAX_TOKENS} output tokens and an adapter drawn Zipf-skewed (weights 1, 1/2, 1/3, 1/4). `x no score`: the "
        "median of the per-round ratios to `adapter_weight` 0.\n\n"
        f"{table(rows, COLUMNS)}\n\n"
        + (f"Errors ({len(errors)}): {errors[:3]}\n\n" if errors else "")
        + f"{stamp((time.time() - started) / 60)}\n"
    )
    (RESULTS / "adapters-routing.json").write_text(json.dumps({"runs": runs, "summary": rows}, indent=2))
    (RESULTS / "adapters-routing.md").write_text(page)
    print(page)
    return 0 if not errors and all(r["wrong_adapter"] == 0 for r in runs) else 1


if __name__ == "__main__":
    sys.exit(main())

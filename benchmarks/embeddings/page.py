"""``make bench``'s section of the served embeddings benchmark (``benchmarks.embeddings``): runs it, keeps its result
in ``embeddings.json`` and renders the table and the plot; ``benchmarks.run`` calls it."""

from __future__ import annotations

import json
from typing import Any

from ..lib.report import RESULTS, bar_plot, png, table


def embeddings(quick: bool) -> str:
    from .runs import measure

    out = measure(quick, rounds=1 if quick else 2)
    (RESULTS / f"embeddings{'-quick' if quick else ''}.json").write_text(json.dumps(out, indent=2))
    return embeddings_section(out, quick)


def embeddings_section(out: dict[str, Any], quick: bool) -> str:
    """The embeddings section (and its plot) from :func:`benchmarks.embeddings.runs.measure`'s result."""
    import math

    import numpy as np

    cfg, rows = out["config"], out["rows"]
    scenarios = list(cfg["scenarios"])
    peers = list(dict.fromkeys(r["peer"] for r in rows))
    pick = lambda p, s, key: next(r[key] for r in rows if r["peer"] == p and r["scenario"] == s)  # noqa: E731
    bar_plot(
        RESULTS / png("embeddings", quick),
        [f"{s} ({cfg['scenarios'][s]} per request)" for s in scenarios],
        {p: [float(np.nan_to_num(pick(p, s, "texts_per_s"))) for s in scenarios] for p in peers},
        "texts/s (median)",
        f"all-MiniLM-L6-v2 on CPU, {cfg['clients']} clients: served embeddings",
    )
    shown = []
    for r in rows:
        cell = lambda key, spec: "–" if math.isnan(r[key]) else format(r[key], spec)  # noqa: E731, B023
        shown.append(
            {
                "scenario": r["scenario"],
                "peer": r["peer"],
                "dtype": r.get("dtype", "?"),
                "texts/s": cell("texts_per_s", ".1f"),
                "p50": cell("p50_ms", ",.0f"),
                "p99": cell("p99_ms", ",.0f"),
                "waste": cell("padding_waste", ".2f"),
                "batch": cell("avg_batch", ".1f"),
                "cosine": cell("min_cosine", ".5f"),
                "x": cell("x_naive", ".2f"),
                "p50x": cell("p50_x_naive", ".2f"),
                "xns": cell("x_naive_app_dtype", ".2f"),
                "xv": cell("x_vllm", ".2f"),
                "p50xv": cell("p50_x_vllm", ".2f"),
                "xvs": cell("x_vllm_app_dtype", ".2f"),
                "p50xvs": cell("p50_x_vllm_app_dtype", ".2f"),
                "others": cell("other_cpu", ".2f"),
                "tries": r["attempts"],
                "status": r["status"][:160],
            }
        )
    lengths = cfg["token_lengths"]
    sent = ", ".join(f"{k} {v:,}" for k, v in cfg.get("texts_sent", {}).items()) or cfg["texts"]
    shown_keys = ("mode", "max_inflight_tokens", "max_inflight", "order")
    batcher = {k: v for k, v in cfg["app_batcher"].items() if k in shown_keys}
    return (
        "### 7. Embeddings served side by side (all-MiniLM-L6-v2, CPU)\n\n"
        f"`POST /v1/embeddings`, one replica each, each peer alone on the machine ({cfg['cores']} cores of "
        f"{cfg.get('cpu', 'an unnamed CPU')}) in turn, every peer started {cfg.get('rounds', 1)} time(s), "
        f"interleaved, each figure the median of its runs. Corpus: {cfg['texts']} long-tailed texts "
        "(`benchmarks.padding.make_texts`; tokens p50 "
        f"{lengths['p50']}, p90 {lengths['p90']}, p99 {lengths['p99']}, max {lengths['max']}); {cfg['clients']} "
        "closed-loop clients, each request one text (`single`) or 16 (`list16`), each client sending at least "
        f"{cfg.get('requests_per_client', 1)} requests (texts sent: {sent}; where one pass over the corpus is fewer, "
        "it is sent again: one pass of lists of 16 would be about one list a client, a single burst). Peers: **app** "
        f"(serve_config.yaml's default engine, vLLM's pooling runner, behind its batcher: `{batcher}`; the client "
        "on `localhost:8000` as in the README: HAProxy, serve.env's door, which forwards each request to the replica's "
        "own port), **app-direct** (the same app, the client on its replica's own HTTP port: serve.env's direct "
        "ingress, `make status` lists it; nothing in between), **app-python-proxy** (the same app with Serve's "
        "Python proxy on 8000 instead of HAProxy: `RAY_SERVE_ENABLE_HA_PROXY=0`), "
        "**app-padded** (the same app with `engine: padded`: sentence-transformers in torch, padded batches cut by "
        "length under a padded-token budget, 1024 on a CPU, a neighbour joining a batch only where that raises its "
        "real tokens over its padded ones plus what a batch costs, `batch_overhead_tokens`, 128 on a CPU), "
        "**app-fifo32** (the padded app, its batcher count-32 "
        "FIFO), **naive** "
        f"(`@serve.batch(max_batch_size={cfg['naive']['max_batch_size']}, "
        f"batch_wait_timeout_s={cfg['naive']['batch_wait_timeout_s']})` around sentence-transformers' `encode`, "
        "in a thread, float32 as sentence-transformers loads it), **naive-app-dtype** (the same in the app's "
        f"dtype here, {cfg['app_dtype']}), **vllm** (vLLM's OpenAI server, `--runner pooling`, as its users start "
        "it: its dtype `auto`; it packs tokens, no padding), **vllm-app-dtype** (the same with `--dtype "
        f"{cfg['app_dtype']}`, the app's: the same engine and precision on both sides). `dtype`: what each "
        "computes in (the app's `auto`: bfloat16 on a CPU with AMX or AVX512-BF16, float32 on others; "
        "docs/embeddings.md). "
        "`waste`: 1 - real / padded tokens of the batches the server ran; `batch`: texts per batch; `cosine`: the "
        f"lowest cosine of {cfg['sampled_vectors']} sampled vectors against sentence-transformers' `encode` of "
        "each text alone, in float32; `x naive`, `x vllm`: texts/s over naive's, over vLLM's server's (`p50 x`: the "
        "same for p50 latency); `x naive (app dtype)`, `x vllm (app dtype)`: over the same peers in the app's "
        "dtype; `others' CPU`: cores' worth of CPU that other "
        "processes on the (shared) machine used during the run; a run during which they used more than "
        f"{cfg['quiet_cores']} was run again after a pause, up to {cfg['retries']} times, and the least disturbed "
        "try is shown (`tries`). Start-up and warm-up (other texts, at the full client count) are not measured.\n\n"
        + table(
            shown,
            [
                ("scenario", "scenario", ""),
                ("peer", "peer", ""),
                ("dtype", "dtype", ""),
                ("texts/s", "texts/s", ""),
                ("p50", "p50 ms", ""),
                ("p99", "p99 ms", ""),
                ("waste", "padding waste", ""),
                ("batch", "batch", ""),
                ("cosine", "min cosine", ""),
                ("x", "x naive", ""),
                ("p50x", "p50 x naive", ""),
                ("xns", "x naive (app dtype)", ""),
                ("xv", "x vllm", ""),
                ("p50xv", "p50 x vllm", ""),
                ("xvs", "x vllm (app dtype)", ""),
                ("p50xvs", "p50 x vllm (app dtype)", ""),
                ("others", "others' CPU", ""),
                ("tries", "tries", ""),
                ("status", "status", ""),
            ],
        )
        + f"\n\n![embeddings]({png('embeddings', quick)})\n"
    )

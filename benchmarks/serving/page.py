"""``make bench``'s section of the OpenAI servers benchmark (``benchmarks.serving``): runs it, keeps every round's rows
in ``serving.json`` and renders the burst and overload tables and the plot; ``benchmarks.run`` calls it."""

from __future__ import annotations

import json

from ..lib.report import RESULTS, bar_plot, png, table


def serving(quick: bool) -> str:
    from .rounds import measure

    out = measure(quick, rounds=1 if quick else 3)
    (RESULTS / f"serving{'-quick' if quick else ''}.json").write_text(json.dumps(out, indent=2))  # every round's rows
    cfg, rows, burst = out["config"], out["rows"], out["burst"]
    overload = [r for r in rows if r["workload"] == "overload"]
    for r in burst:
        r["tput_range"] = f"{r['tput_vs_vllm_min']:.2f}-{r['tput_vs_vllm_max']:.2f}" if r["rounds"] > 1 else ""
    for r in rows + burst:  # seconds read better than ms at these latencies
        for key in ("ttft_p50", "ttft_p99", "e2el_mean", "e2el_p99"):
            r[f"{key}_s"] = r[f"{key}_ms"] / 1000
    groups = [f"{r['peer']}\n{r['backend']}" for r in burst]
    bar_plot(
        RESULTS / png("serving", quick),
        groups,
        {"output tok/s": [r["output_tok_s"] for r in burst], "median TTFT, s": [r["ttft_p50_s"] for r in burst]},
        "",
        f"vllm bench serve, burst of {cfg['burst_prompts']}: output tok/s and median TTFT",
    )
    rates = ", ".join(f"{b} {v:.2f} req/s" for b, v in cfg["overload_rps"].items()) or "not measured"
    failures = [f"- {r['peer']} / {r['backend']} / {r['workload']}: {r['status']}" for r in rows if r["status"] != "ok"]
    latency = [
        ("ttft_p50_s", "TTFT p50 s", ".2f"),
        ("ttft_p99_s", "TTFT p99 s", ".2f"),
        ("tpot_p50_ms", "TPOT p50 ms", ".0f"),
        ("tpot_p99_ms", "TPOT p99 ms", ".0f"),
        ("e2el_mean_s", "E2E mean s", ".2f"),
        ("e2el_p99_s", "E2E p99 s", ".2f"),
    ]
    return (
        "### 4. OpenAI servers side by side, measured with vLLM's own client (`vllm bench serve`)\n\n"
        f"Bundled model, {cfg['dtype']}, one replica each, each peer alone on the CPU ({cfg['cores']} cores). "
        f"Random dataset: about {cfg['input_len']} prompt tokens, output lengths mixed around {cfg['output_len']} "
        f"(range ratios {cfg['range_ratio']}), `ignore_eos`, greedy, streamed. Backends: `openai` "
        "(/v1/completions) and `openai-chat` (/v1/chat/completions). Start-up is not measured. "
        "`streamed`: the share of answers that arrived in more than one chunk (0: TTFT is the whole latency). "
        "The Ray-based peers (app, app-slo, ray-serve-llm) run with `serve.env`'s Ray Serve settings, as "
        "`make serve` does; each peer's processes, a vLLM engine its replica left behind included, are gone "
        "before the next starts.\n\n"
        f"**Burst**: {cfg['burst_prompts']} requests at once, in {cfg['rounds']} round(s) for "
        f"{' and '.join(cfg['round_peers'])} (each peer started afresh in every round, their order alternating) "
        "and one for the others. Each figure is the median over a peer's rounds; `tok/s x vllm` is the median of "
        "the ratios taken within each round, `range` their lowest and highest; done and failed are totals.\n\n"
        + table(
            burst,
            [
                ("peer", "peer", ""),
                ("backend", "backend", ""),
                ("rounds", "rounds", ".0f"),
                ("completed", "done", ".0f"),
                ("failed", "failed", ".0f"),
                ("output_tok_s", "output tok/s", ".1f"),
                *latency,
                ("streamed", "streamed", ".2f"),
                ("tput_vs_vllm", "tok/s x vllm", ".2f"),
                ("tput_range", "range", ""),
                ("ttft_vs_vllm", "TTFT p50 x vllm", ".2f"),
            ],
        )
        + f"\n\n**Overload**: {cfg['overload_prompts']} requests, Poisson arrivals at {cfg['overload_factor']:g}x "
        f"the vllm peer's burst request throughput ({rates}); goodput = requests per second that completed with "
        f"TTFT under {cfg['slo_ttft_ms'] / 1000:g} s and time per output token under {cfg['slo_tpot_ms']:g} ms "
        "(a refused request, e.g. 503, is not good). app-slo is the app with "
        f"`batcher: {cfg['slo_app']}`: admission keeps the engine's share, and sheds what would wait too long.\n\n"
        + table(
            overload,
            [
                ("peer", "peer", ""),
                ("backend", "backend", ""),
                ("completed", "done", ".0f"),
                ("failed", "failed", ".0f"),
                ("good", "good", ".0f"),
                ("goodput_rps", "goodput req/s", ".2f"),
                ("output_tok_s", "output tok/s", ".1f"),
                *latency[:2],
                ("e2el_p99_s", "E2E p99 s", ".2f"),
                ("tput_vs_vllm", "tok/s x vllm", ".2f"),
            ],
        )
        + ("\n\nNot ok:\n" + "\n".join(failures) if failures else "")
        + f"\n\n![serving]({png('serving', quick)})\n"
    )

